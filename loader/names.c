/* names.c - printable names of the dataset format's enums. */
#include <stddef.h>

#include "loader/dataset.h"

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
