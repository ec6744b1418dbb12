/*
 * replay_main.c - runs a libFuzzer target over files without libFuzzer, so
 * the seed corpus (and any crash reproducer added to it) is replayed by
 * ctest in every build, sanitizer builds included. Usage: replay DIR|FILE...
 * Exit 0 when every input ran; a crash or sanitizer report fails the test.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    uint8_t *buf;
    size_t len;
    if (rt_file_read(path, &buf, &len) < 0) {
        fprintf(stderr, "%s\n", rt_errmsg());
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0, errors = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) < 0) {
            fprintf(stderr, "%s: missing\n", argv[i]);
            errors++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            errors += run_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            char p[4096];
            if (e->d_name[0] == '.')
                continue;
            snprintf(p, sizeof(p), "%s/%s", argv[i], e->d_name);
            errors += run_file(p);
            files++;
        }
        if (d)
            closedir(d);
    }
    printf("replayed %d inputs, %d unreadable\n", files, errors);
    return errors || files == 0 ? 1 : 0;
}
