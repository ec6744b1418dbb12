/*
 * manifest.h (private to loader/) - writing manifest.json. Reading is the
 * public rt_dataset_open() in dataset.h.
 */
#ifndef RT_LOADER_MANIFEST_H
#define RT_LOADER_MANIFEST_H

#include <jansson.h>

#include "loader/dataset.h"

/*
 * Serialises `info` (everything but `dir`, `stored_bytes`, the float
 * have_norm/mean/std and the variable-size and file summaries) plus the
 * members of `extra` (borrowed, may be NULL: "variable_size", "files",
 * placed after "shape") and the packing parameters `pack` (borrowed, may be
 * NULL) as manifest.json text, keys in a fixed order so equal inputs give
 * equal bytes. `mean` and `std` (info->channels doubles each, 0..1 units)
 * become "mean" and "std" at full double precision; pass NULL for both to
 * leave them out. Returns a malloc'd, NUL-terminated string or NULL (-ENOMEM
 * in rt_errmsg()).
 */
char *rt_manifest_dump(const struct rt_dataset_info *info, const double *mean, const double *std, json_t *extra,
                       json_t *pack);

#endif
