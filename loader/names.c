/* names.c - printable names of the loader's enums. */
#include <errno.h>
#include <string.h>

#include "loader/loader.h"

const char *rt_codec_name(enum rt_codec codec)
{
    switch (codec) {
    case RT_CODEC_RAW: return "raw";
    case RT_CODEC_JPEG: return "jpeg";
    }
    return NULL;
}

const char *rt_split_name(enum rt_split split)
{
    switch (split) {
    case RT_SPLIT_TRAIN: return "train";
    case RT_SPLIT_VAL: return "val";
    case RT_SPLIT_TEST: return "test";
    case RT_SPLIT_COUNT: break;
    }
    return NULL;
}

const char *rt_shuffle_name(enum rt_shuffle shuffle)
{
    switch (shuffle) {
    case RT_SHUFFLE_EXACT: return "exact";
    case RT_SHUFFLE_WINDOW: return "window";
    case RT_SHUFFLE_NONE: return "none";
    }
    return NULL;
}

int rt_shuffle_parse(const char *name, enum rt_shuffle *out)
{
    for (int s = RT_SHUFFLE_EXACT; s <= RT_SHUFFLE_NONE; s++)
        if (!strcmp(name, rt_shuffle_name((enum rt_shuffle)s))) {
            *out = (enum rt_shuffle)s;
            return 0;
        }
    return -EINVAL;
}
