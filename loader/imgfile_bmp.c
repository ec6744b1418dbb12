/*
 * imgfile_bmp.c - Windows/OS2 BMP files from memory, read the way Pillow 9.4's
 * BmpImagePlugin reads them (and so the way torchvision's ImageFolder sees
 * them): what it refuses we refuse, and every file it opens decodes to its
 * pixels exactly.
 *
 * Our own parser: no Debian library decodes BMP from memory with Pillow's
 * variants (libjpeg-turbo's tjLoadImage reads files by name only and lacks
 * RLE and 1/4/16-bit pixels; stb_image differs from Pillow on 16-bit
 * expansion and RLE). Every offset and size comes from the file and is
 * checked against the buffer before it is used.
 *
 * Pillow's rules kept here, each from BmpImagePlugin.py / Unpack.c:
 *  - headers of 12 (OS/2 1.x: unsigned 16-bit sizes, BGR palette, always
 *    bottom-up), 40, 64, 108 and 124 bytes; 52 and 56 (Adobe's) are refused;
 *    a height whose top byte is 0xFF is top-down (2^32 - height rows);
 *  - 1/4/8 bits: a palette of `colors` entries (0: 2^bits) read right after
 *    the header whatever bfOffBits says, as far as the file goes; a palette
 *    that is exactly the gray ramp makes the image gray ("L", or "1" for two
 *    entries black and white, then read one bit per pixel whatever the
 *    depth); indexes past the palette read the gray ramp's entry (Pillow
 *    fills the rest of its 256 entries so); more than 256 entries fail;
 *  - 16 bits: 5-5-5 unless BI_BITFIELDS says 5-6-5, each field v expanded as
 *    v * 255 / 31 (or / 63), truncated; 24 and 32 bits as BGR(X); 32-bit
 *    BI_BITFIELDS only with Pillow's six masks; alpha dropped;
 *  - RLE8/RLE4 as Pillow's Python decoder does: a run that overflows the
 *    row is cut at the row's end; absolute runs are not cut; an odd RLE4
 *    absolute count loses its last pixel; padding follows the file offset's
 *    parity; end-of-line and delta fill with index 0, and a delta's
 *    right/up are the two bytes after the two that follow its escape (Pillow
 *    reads two and drops them); stopping before the last pixel (end of
 *    bitmap, end of data) fails ("not enough image data");
 *  - raw rows: the file must hold every row up to the last one's pixels (its
 *    padding may be missing), else Pillow says "image file is truncated".
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/imgfile_priv.h"

enum bmp_mode { BMP_P, BMP_L, BMP_1, BMP_RGB };

struct bmp {
    uint32_t w, h, bits, comp, hsize;
    int topdown;
    enum bmp_mode mode;
    uint32_t unpack_bits; /* bits per pixel as Pillow unpacks a raw row */
    int sixteen;          /* 16-bit: 5-6-5 (else 5-5-5) */
    int pos[3];           /* 24/32-bit: byte of R, G, B within a pixel */
    size_t off;           /* pixel data */
    uint8_t pal[256][3];
};

/* Byte positions of R, G, B for a 32-bit BI_BITFIELDS mask set Pillow knows; -1 for the others. */
static int bmp_masks32(const uint32_t m[4], int pos[3])
{
    static const struct {
        uint32_t m[4];
        int pos[3];
    } known[] = {
        {{0xFF0000, 0xFF00, 0xFF, 0}, {2, 1, 0}},                 /* BGRX */
        {{0xFF000000, 0xFF0000, 0xFF00, 0}, {3, 2, 1}},           /* XBGR */
        {{0xFF000000, 0xFF0000, 0xFF00, 0xFF}, {3, 2, 1}},        /* ABGR */
        {{0xFF, 0xFF00, 0xFF0000, 0xFF000000}, {0, 1, 2}},        /* RGBA */
        {{0xFF0000, 0xFF00, 0xFF, 0xFF000000}, {2, 1, 0}},        /* BGRA */
        {{0, 0, 0, 0}, {2, 1, 0}},                                /* BGRA */
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(known); i++) {
        if (memcmp(known[i].m, m, sizeof(known[i].m)) == 0) {
            memcpy(pos, known[i].pos, sizeof(known[i].pos));
            return 0;
        }
    }
    return -1;
}

static int bmp_header(const uint8_t *buf, size_t len, const char *name, struct bmp *b, enum rt_img_bad *why)
{
    size_t pos;
    uint64_t colors = 0;
    uint32_t pad;

    memset(b, 0, sizeof(*b));
    if (len < 18)
        return rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated BMP: %zu bytes, shorter than its file header", name,
                          len);
    b->hsize = rt_le32(buf + 14);
    if (b->hsize != 12 && b->hsize != 40 && b->hsize != 64 && b->hsize != 108 && b->hsize != 124)
        return rt_img_bad(why, RT_IMG_UNSUPPORTED,
                          "%s: BMP with a %" PRIu32 "-byte header is not decoded here (Pillow refuses it too); "
                          "convert it to PNG",
                          name, b->hsize);
    if (len < 14 + (size_t)b->hsize)
        return rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated BMP: header ends early", name);
    const uint8_t *hd = buf + 18; /* the header after its size field */
    pos = 14 + b->hsize;
    if (b->hsize == 12) {
        b->w = rt_le16(hd);
        b->h = rt_le16(hd + 2);
        b->bits = rt_le16(hd + 6);
        pad = 3;
    } else {
        b->topdown = hd[7] == 0xFF;
        b->w = rt_le32(hd);
        b->h = b->topdown ? (uint32_t)(0 - rt_le32(hd + 4)) : rt_le32(hd + 4);
        b->bits = rt_le16(hd + 10);
        b->comp = rt_le32(hd + 12);
        colors = rt_le32(hd + 28);
        pad = 4;
    }
    if (b->bits <= 8 && !colors)
        colors = (uint64_t)1 << b->bits;
    b->off = rt_le32(buf + 10);
    if (b->off == 14 + (size_t)b->hsize && b->bits <= 8)
        b->off += 4 * colors;

    switch (b->bits) {
    case 1: case 4: case 8: b->mode = BMP_P; break;
    case 16: case 24: case 32: b->mode = BMP_RGB; break;
    default:
        return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: BMP of %" PRIu32 " bits per pixel is not decoded here; convert "
                          "it to PNG", name, b->bits);
    }
    b->pos[0] = 2, b->pos[1] = 1, b->pos[2] = 0;
    if (b->comp == 3) { /* BI_BITFIELDS */
        uint32_t m[4] = {0, 0, 0, 0};
        if (b->hsize >= 56) {
            for (int k = 0; k < 4; k++)
                m[k] = rt_le32(hd + 36 + 4 * k);
        } else {
            if (len < pos + 12)
                return rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated BMP: bit field masks missing", name);
            for (int k = 0; k < 3; k++)
                m[k] = rt_le32(buf + pos + 4 * k);
            pos += 12;
        }
        int ok = 0;
        if (b->bits == 32)
            ok = bmp_masks32(m, b->pos) == 0;
        else if (b->bits == 24)
            ok = m[0] == 0xFF0000 && m[1] == 0xFF00 && m[2] == 0xFF;
        else if (b->bits == 16)
            ok = (m[0] == 0xF800 && m[1] == 0x7E0 && m[2] == 0x1F) || (m[0] == 0x7C00 && m[1] == 0x3E0 && m[2] == 0x1F);
        if (!ok)
            return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: BMP bit field layout not decoded here (Pillow refuses "
                              "it too); convert it to PNG", name);
        b->sixteen = b->bits == 16 && m[0] == 0xF800;
    } else if (b->comp == 1 || b->comp == 2) { /* RLE8, RLE4: Pillow's decoder fills palette indexes only */
        if (b->mode != BMP_P)
            return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: run-length coded BMP of %" PRIu32 " bits per pixel; "
                              "convert it to PNG", name, b->bits);
    } else if (b->comp != 0) {
        return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: BMP compression %" PRIu32 " is not decoded here; convert it "
                          "to PNG", name, b->comp);
    }

    if (b->mode == BMP_P) {
        if (colors > 256)
            return rt_img_bad(why, RT_IMG_CORRUPT, "%s: corrupt BMP: a palette of %" PRIu64 " colours (at most 256)",
                              name, colors);
        const size_t have = pos < len ? RT_MIN(len - pos, (size_t)(pad * colors)) : 0;
        const uint8_t *p = buf + pos;
        int gray = 1;
        for (uint32_t i = 0; i < colors; i++) {
            const uint32_t val = colors == 2 ? i * 255 : i;
            if ((size_t)i * pad + 3 > have || p[i * pad] != val || p[i * pad + 1] != val || p[i * pad + 2] != val)
                gray = 0;
        }
        for (uint32_t i = 0; i < 256; i++) /* Pillow's palette before the file's entries: the gray ramp */
            b->pal[i][0] = b->pal[i][1] = b->pal[i][2] = (uint8_t)i;
        for (size_t i = 0; i < have / pad; i++)
            for (int k = 0; k < 3; k++)
                b->pal[i][k] = p[i * pad + 2 - k];
        if (gray)
            b->mode = colors == 2 ? BMP_1 : BMP_L;
        pos += have;
    }
    /* Pillow hands RLE output to a "1" image as palette indexes, which it cannot unpack. */
    if (b->mode == BMP_1 && (b->comp == 1 || b->comp == 2))
        return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: run-length coded black-and-white BMP (Pillow refuses it "
                          "too); convert it to PNG", name);
    b->unpack_bits = b->mode == BMP_1 ? 1 : b->mode == BMP_L ? 8 : b->bits;
    if (!b->off) /* Pillow reads on from where the header (and palette) ended */
        b->off = pos;
    return rt_img_check_size(name, "BMP", b->w, b->h, why);
}

/* Pixel x of a raw row as Pillow's unpacker for b's mode reads it, to RGB. */
static void bmp_pixel(const struct bmp *b, const uint8_t *row, uint32_t x, uint8_t *rgb)
{
    uint32_t v;
    switch (b->unpack_bits) {
    case 1:
    case 4:
    case 8: v = rt_img_packed(row, x, (int)b->unpack_bits); break;
    case 16: {
        const uint32_t p = rt_le16(row + 2 * (size_t)x);
        if (b->sixteen) {
            rgb[0] = (uint8_t)((p >> 11 & 31) * 255 / 31);
            rgb[1] = (uint8_t)((p >> 5 & 63) * 255 / 63);
        } else {
            rgb[0] = (uint8_t)((p >> 10 & 31) * 255 / 31);
            rgb[1] = (uint8_t)((p >> 5 & 31) * 255 / 31);
        }
        rgb[2] = (uint8_t)((p & 31) * 255 / 31);
        return;
    }
    default: {
        const uint8_t *s = row + (size_t)x * (b->bits / 8);
        for (int k = 0; k < 3; k++)
            rgb[k] = s[b->pos[k]];
        return;
    }
    }
    if (b->mode == BMP_1)
        rgb[0] = rgb[1] = rgb[2] = v ? 255 : 0;
    else if (b->mode == BMP_L)
        rgb[0] = rgb[1] = rgb[2] = (uint8_t)v;
    else
        memcpy(rgb, b->pal[v], 3);
}

/*
 * Pillow 9.4's BmpRleDecoder into idx (w*h palette indexes in file row
 * order); 0 when every pixel was reached, else -EBADMSG (truncated when the
 * data ran out, corrupt when the bitmap ended early).
 */
static int bmp_rle(const struct bmp *b, const uint8_t *buf, size_t len, const char *name, uint8_t *idx,
                   enum rt_img_bad *why)
{
    const uint64_t total = (uint64_t)b->w * b->h, w = b->w;
    const int rle4 = b->comp == 2;
    uint64_t n = 0, x = 0; /* n: pixels produced (may run past total), x: Pillow's column counter */
    size_t at = b->off;
    int ran_out = 0;

#define PUT(v)                   \
    do {                         \
        if (n < total)           \
            idx[n] = (uint8_t)(v); \
        n++;                     \
    } while (0)
    while (n < total) {
        if (at + 2 > len) {
            ran_out = 1;
            break;
        }
        uint32_t count = buf[at], byte = buf[at + 1];
        at += 2;
        if (count) {
            if (x + count > w)
                count = x < w ? (uint32_t)(w - x) : 0;
            for (uint32_t i = 0; i < count; i++)
                PUT(rle4 ? (i % 2 ? byte & 15 : byte >> 4) : byte);
            x += count;
        } else if (byte == 0) { /* end of line */
            while (n % w)
                PUT(0);
            x = 0;
        } else if (byte == 1) { /* end of bitmap */
            break;
        } else if (byte == 2) { /* delta: Pillow 9.4 reads two bytes, drops them and takes the next two */
            if (at + 2 > len) {
                ran_out = 1;
                break;
            }
            at += 2;
            if (at + 2 > len)
                return rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated BMP: run-length delta cut short", name);
            const uint64_t skip = buf[at] + (uint64_t)buf[at + 1] * w;
            at += 2;
            if (n < total)
                memset(idx + n, 0, RT_MIN(skip, total - n));
            n += skip;
            x = n % w;
        } else { /* absolute run of `byte` pixels */
            const size_t want = rle4 ? byte / 2 : byte, got = RT_MIN(want, len - at);
            for (size_t i = 0; i < got; i++) {
                if (rle4) {
                    PUT(buf[at + i] >> 4);
                    PUT(buf[at + i] & 15);
                } else {
                    PUT(buf[at + i]);
                }
            }
            at += got;
            if (got < want) {
                ran_out = 1;
                break;
            }
            x += byte;
            if (at % 2) /* the file offset's parity, as Pillow's fd.tell() */
                at++;
        }
    }
#undef PUT
    if (n >= total)
        return 0;
    if (ran_out)
        return rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated BMP: run-length data ends at pixel %" PRIu64 " of %"
                          PRIu64, name, n, total);
    return rt_img_bad(why, RT_IMG_CORRUPT, "%s: corrupt BMP: the run-length data ends at pixel %" PRIu64 " of %" PRIu64
                      " (not enough image data)", name, n, total);
}

int rt_img_bmp(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
               struct rt_img_info *info, uint32_t *w, uint32_t *h, enum rt_img_bad *why)
{
    struct bmp hdr, *b = &hdr;
    int rc;

    if ((rc = bmp_header(buf, len, name, b, why)) < 0)
        goto out;
    if (!d) {
        info->width = b->w;
        info->height = b->h;
        info->gray = b->mode == BMP_L || b->mode == BMP_1;
        goto out;
    }
    const size_t n = (size_t)b->w * b->h;
    const int target = channels == 1;
    const int rle = b->comp == 1 || b->comp == 2;
    const size_t stride = (((size_t)b->w * b->bits + 31) >> 3) & ~(size_t)3;
    const size_t rowbytes = ((size_t)b->w * b->unpack_bits + 7) / 8;
    /* A gray-ramp palette read as "L" from 1/4-bit rows wider than they are: Pillow's decoder refuses it (from a
     * file object, as ImageFolder opens it: "codec configuration error"). */
    if (!rle && rowbytes > stride) {
        rc = rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: %" PRIu32 "-bit BMP with a gray palette wider than its rows "
                        "(Pillow refuses it too); convert it to PNG", name, b->bits);
        goto out;
    }
    if (!rle && (b->off > len || len - b->off < stride * (b->h - 1) + rowbytes)) {
        rc = rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated BMP: %zu of %zu pixel bytes", name,
                        b->off < len ? len - b->off : 0, stride * (b->h - 1) + rowbytes);
        goto out;
    }
    if ((rc = rt_imgdec_reserve(d, 0, n * channels)) < 0 || (target && (rc = rt_imgdec_reserve(d, 1, n * 3)) < 0) ||
        (rle && !target && (rc = rt_imgdec_reserve(d, 1, n)) < 0))
        goto out;
    uint8_t *rgb = rt_imgdec_buf(d, target);
    if (rle) {
        /* The palette indexes, one a pixel: in buffer 1, or in buffer 0 when buffer 1 holds the RGB (gray out). */
        uint8_t *idx = target ? rt_imgdec_buf(d, 0) : rt_imgdec_buf(d, 1);
        if ((rc = bmp_rle(b, buf, len, name, idx, why)) < 0)
            goto out;
        for (uint32_t y = 0; y < b->h; y++) {
            const uint8_t *src = idx + (size_t)(b->topdown ? y : b->h - 1 - y) * b->w;
            uint8_t *dst = rgb + (size_t)y * b->w * 3;
            for (uint32_t x = 0; x < b->w; x++) {
                const uint8_t v = src[x];
                if (b->mode == BMP_L)
                    dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = v;
                else
                    memcpy(dst + 3 * x, b->pal[v], 3);
            }
        }
    } else {
        for (uint32_t y = 0; y < b->h; y++) {
            const uint8_t *row = buf + b->off + (size_t)(b->topdown ? y : b->h - 1 - y) * stride;
            uint8_t *dst = rgb + (size_t)y * b->w * 3;
            for (uint32_t x = 0; x < b->w; x++)
                bmp_pixel(b, row, x, dst + 3 * x);
        }
    }
    if (target)
        rt_img_rgb_to_gray(rgb, rt_imgdec_buf(d, 0), n);
    *w = b->w;
    *h = b->h;
out:
    if (rc == -ENOMEM)
        *why = RT_IMG_OK;
    return rc;
}
