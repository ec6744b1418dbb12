/*
 * codec.h (private to loader/) - JPEG encode/decode between our CHW uint8
 * layout and TurboJPEG's interleaved HWC, shared by pack, the image-folder
 * source and the block decoder.
 */
#ifndef RT_LOADER_CODEC_H
#define RT_LOADER_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <turbojpeg.h>

/*
 * Reads a JPEG's size and whether it is grayscale. A libjpeg warning other
 * than the end of the data (damage pack accepts, as Pillow does) is not an
 * error. Returns 0 or -EBADMSG with a message naming `name`.
 */
int rt_jpeg_probe(tjhandle tj, const uint8_t *jpeg, size_t len, const char *name, uint32_t *width,
                  uint32_t *height, int *gray);

/*
 * Decodes a JPEG of exactly h x w into CHW `out` with c = 1 (gray) or 3 (RGB)
 * channels; `hwc` is scratch of c*h*w bytes. Data that ends early is an
 * error; other damage libjpeg decodes through with a warning is not (pack
 * stores such files as Pillow reads them and lists them in the manifest).
 * Returns 0 or -EBADMSG.
 */
int rt_jpeg_decode_chw(tjhandle tj, const uint8_t *jpeg, size_t len, uint32_t c, uint32_t h,
                       uint32_t w, uint8_t *out, uint8_t *hwc, const char *name);

/*
 * Encodes a CHW image at `quality` (4:4:4 chroma: CIFAR-sized images lose
 * too much colour with subsampling). *jpeg is allocated by TurboJPEG: free
 * with tjFree(). `hwc` is scratch of c*h*w bytes. Returns 0 or -EIO.
 */
int rt_jpeg_encode_chw(tjhandle tj, const uint8_t *chw, uint32_t c, uint32_t h, uint32_t w,
                       int quality, uint8_t *hwc, uint8_t **jpeg, size_t *len);

#endif
