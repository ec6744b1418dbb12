/*
 * imgdump.c - `rt_imgdump [--gray] [--exif-rotate] IN OUT [IN OUT ...]`:
 * decodes each image file with loader/imgfile.c and writes the pixels as
 * binary PPM (P6), or PGM (P5) with --gray, for tests/imgfile_vs_pillow.py
 * to compare with Pillow. Exit 0 when every file decoded, 1 otherwise (the
 * reason printed per file).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/imgfile.h"

int main(int argc, char **argv)
{
    uint32_t channels = 3;
    int rotate = 0, i = 1, failed = 0;
    struct rt_imgdec *d = NULL;

    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--gray") == 0)
            channels = 1;
        else if (strcmp(argv[i], "--exif-rotate") == 0)
            rotate = 1;
        else
            break;
    }
    if (i >= argc || (argc - i) % 2 != 0) {
        fprintf(stderr, "usage: rt_imgdump [--gray] [--exif-rotate] IN OUT [IN OUT ...]\n");
        return 2;
    }
    if (rt_imgdec_create(&d) < 0) {
        fprintf(stderr, "%s\n", rt_errmsg());
        return 1;
    }
    for (; i + 1 < argc; i += 2) {
        uint8_t *buf;
        size_t len;
        const uint8_t *px;
        uint32_t w, h;
        enum rt_img_bad why;
        FILE *f;

        if (rt_file_read(argv[i], &buf, &len) < 0) {
            fprintf(stderr, "%s\n", rt_errmsg());
            failed = 1;
            continue;
        }
        if (rt_img_decode(d, buf, len, argv[i], channels, rotate, &px, &w, &h, &why) < 0) {
            fprintf(stderr, "%s (%s)\n", rt_errmsg(), rt_img_bad_name(why));
            failed = 1;
        } else if (!(f = fopen(argv[i + 1], "wb"))) {
            perror(argv[i + 1]);
            failed = 1;
        } else {
            fprintf(f, "P%c\n%u %u\n255\n", channels == 1 ? '5' : '6', w, h);
            if (fwrite(px, 1, (size_t)w * h * channels, f) != (size_t)w * h * channels)
                failed = 1;
            if (fclose(f) != 0)
                failed = 1;
        }
        free(buf);
    }
    rt_imgdec_destroy(d);
    return failed;
}
