/*
 * manifest.c - manifest.json: reading and validating it into an rt_dataset,
 * and writing it for pack. The manifest lists the dataset's shape, codec,
 * classes, the training split's per-channel mean and std and, per split,
 * the shards with their sizes and XXH64 checksums (docs/FORMAT.md,
 * "manifest.json"). Reading treats the text as hostile.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/format.h"
#include "loader/manifest.h"

struct rt_dataset {
    json_t *root; /* owns every string the info points to */
    char *dir;
    const char **class_names;
    struct rt_shard_ref *shards[RT_SPLIT_COUNT];
    uint64_t *class_counts[RT_SPLIT_COUNT];
    struct rt_dataset_info info;
};

void rt_dataset_close(struct rt_dataset *ds)
{
    if (!ds)
        return;
    for (int s = 0; s < RT_SPLIT_COUNT; s++) {
        free(ds->shards[s]);
        free(ds->class_counts[s]);
    }
    free(ds->class_names);
    free(ds->dir);
    json_decref(ds->root);
    free(ds);
}

const struct rt_dataset_info *rt_dataset_info(const struct rt_dataset *ds) { return &ds->info; }

/* Reads a non-negative integer member; `what` names it in messages. */
static int get_uint(json_t *obj, const char *key, uint64_t max, const char *name, const char *what,
                    uint64_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v))
        return rt_errf(-EBADMSG, "%s: %s: \"%s\" missing or not an integer", name, what, key);
    json_int_t i = json_integer_value(v);
    if (i < 0 || (uint64_t)i > max)
        return rt_errf(-EBADMSG, "%s: %s: \"%s\" = %lld out of range [0, %" PRIu64 "]", name, what, key,
                       (long long)i, max);
    *out = (uint64_t)i;
    return 0;
}

static const char *get_string(json_t *obj, const char *key)
{
    return json_string_value(json_object_get(obj, key));
}

/* A shard file name must stay inside the dataset directory. */
static int safe_file_name(const char *s)
{
    if (!s || !*s || strcmp(s, ".") == 0 || strcmp(s, "..") == 0 || strlen(s) > 255)
        return 0;
    return strchr(s, '/') == NULL;
}

/*
 * Reads the optional "mean" and "std": both or neither, each an array of
 * `channels` numbers, mean in [0, 1] and std in [0, 0.5] (the largest
 * standard deviation values in [0, 1] can have).
 */
static int parse_norm(struct rt_dataset *ds, json_t *root, const char *name)
{
    static const struct {
        const char *key;
        double max;
    } fields[2] = {{"mean", 1.0}, {"std", 0.5}};
    json_t *arr[2] = {json_object_get(root, "mean"), json_object_get(root, "std")};
    float *dst[2] = {ds->info.mean, ds->info.std};

    if (!arr[0] && !arr[1])
        return 0;
    if (!arr[0] || !arr[1])
        return rt_errf(-EBADMSG, "%s: \"%s\" without \"%s\": the two go together", name, fields[!arr[0]].key,
                       fields[!arr[1]].key);
    for (int f = 0; f < 2; f++) {
        if (!json_is_array(arr[f]) || json_array_size(arr[f]) != ds->info.channels)
            return rt_errf(-EBADMSG, "%s: \"%s\" must be an array of %" PRIu32 " numbers, one per channel", name,
                           fields[f].key, ds->info.channels);
        for (size_t c = 0; c < ds->info.channels; c++) {
            json_t *v = json_array_get(arr[f], c);
            double x = json_number_value(v);
            if (!json_is_number(v) || !(x >= 0 && x <= fields[f].max))
                return rt_errf(-EBADMSG, "%s: \"%s\"[%zu] is not a number in [0, %g]", name, fields[f].key, c,
                               fields[f].max);
            dst[f][c] = (float)x;
        }
    }
    ds->info.have_norm = 1;
    return 0;
}

static int parse_split(struct rt_dataset *ds, enum rt_split sp, json_t *js, const char *name)
{
    struct rt_split_info *si = &ds->info.split[sp];
    const char *sname = rt_split_name(sp);
    char what[64];
    uint64_t sum = 0, total = 0;
    json_t *shards, *counts;
    int rc;

    snprintf(what, sizeof(what), "splits.%s", sname);
    if (!json_is_object(js))
        return rt_errf(-EBADMSG, "%s: %s is not an object", name, what);
    rc = get_uint(js, "records", (uint64_t)1 << 48, name, what, &total);
    if (rc < 0)
        return rc;
    si->records = total;

    counts = json_object_get(js, "class_counts");
    if (!json_is_array(counts) || json_array_size(counts) != ds->info.num_classes)
        return rt_errf(-EBADMSG, "%s: %s.class_counts must be an array of %" PRIu32 " integers", name, what,
                       ds->info.num_classes);
    ds->class_counts[sp] = rt_calloc(ds->info.num_classes, sizeof(uint64_t), "class counts");
    if (!ds->class_counts[sp])
        return -ENOMEM;
    for (size_t c = 0; c < ds->info.num_classes; c++) {
        json_t *v = json_array_get(counts, c);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return rt_errf(-EBADMSG, "%s: %s.class_counts[%zu] is not a non-negative integer", name, what, c);
        ds->class_counts[sp][c] = (uint64_t)json_integer_value(v);
        sum += ds->class_counts[sp][c];
    }
    if (sum != total)
        return rt_errf(-EBADMSG, "%s: %s.class_counts add up to %" PRIu64 ", records says %" PRIu64, name,
                       what, sum, total);
    si->class_counts = ds->class_counts[sp];

    shards = json_object_get(js, "shards");
    if (!json_is_array(shards))
        return rt_errf(-EBADMSG, "%s: %s.shards missing or not an array", name, what);
    if (json_array_size(shards) > 1000000)
        return rt_errf(-EBADMSG, "%s: %s.shards lists too many shards", name, what);
    si->nshards = (uint32_t)json_array_size(shards);
    ds->shards[sp] = rt_calloc(si->nshards, sizeof(struct rt_shard_ref), "shard list");
    if (!ds->shards[sp])
        return -ENOMEM;
    sum = 0;
    for (uint32_t i = 0; i < si->nshards; i++) {
        json_t *o = json_array_get(shards, i);
        struct rt_shard_ref *r = &ds->shards[sp][i];
        const char *hex;
        char *end;

        snprintf(what, sizeof(what), "splits.%s.shards[%" PRIu32 "]", sname, i);
        if (!json_is_object(o))
            return rt_errf(-EBADMSG, "%s: %s is not an object", name, what);
        r->file = get_string(o, "file");
        if (!safe_file_name(r->file))
            return rt_errf(-EBADMSG, "%s: %s.file must be a plain file name in the dataset directory", name,
                           what);
        if ((rc = get_uint(o, "records", (uint64_t)1 << 40, name, what, &r->records)) < 0 ||
            (rc = get_uint(o, "bytes", (uint64_t)1 << 50, name, what, &r->bytes)) < 0)
            return rc;
        if (r->records == 0)
            return rt_errf(-EBADMSG, "%s: %s holds no records", name, what);
        hex = get_string(o, "xxh64");
        if (!hex || strlen(hex) != 16 || strspn(hex, "0123456789abcdef") != 16)
            return rt_errf(-EBADMSG, "%s: %s.xxh64 must be 16 lowercase hex digits", name, what);
        r->xxh64 = strtoull(hex, &end, 16);
        r->first_record = sum;
        sum += r->records;
        ds->info.stored_bytes += r->bytes;
    }
    if (sum != total)
        return rt_errf(-EBADMSG, "%s: splits.%s: shards hold %" PRIu64 " records, records says %" PRIu64, name,
                       sname, sum, total);
    si->shards = ds->shards[sp];
    return 0;
}

/* Reads [height, width] (each 1..RT_MAX_DIM) into hw. */
static int get_hw(json_t *obj, const char *key, const char *name, uint32_t hw[2])
{
    json_t *a = json_object_get(obj, key);
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_is_array(a) && json_array_size(a) == 2 ? json_array_get(a, i) : NULL;
        json_int_t d = json_is_integer(v) ? json_integer_value(v) : -1;
        if (d < 1 || d > RT_MAX_DIM)
            return rt_errf(-EBADMSG, "%s: \"variable_size\": \"%s\" must be [height, width]", name, key);
        hw[i] = (uint32_t)d;
    }
    return 0;
}

/* "variable_size": required exactly when the shape's height and width are 0. */
static int parse_variable(struct rt_dataset *ds, json_t *root, const char *name)
{
    json_t *vs = json_object_get(root, "variable_size");
    uint64_t max_side = 0;
    int rc;

    if (ds->info.height != 0) {
        if (vs)
            return rt_errf(-EBADMSG, "%s: \"variable_size\" given for fixed-size records", name);
        return 0;
    }
    if (!json_is_object(vs))
        return rt_errf(-EBADMSG, "%s: \"shape\" says variable-size records but \"variable_size\" is missing", name);
    if ((rc = get_uint(vs, "max_side", RT_MAX_DIM, name, "variable_size", &max_side)) < 0 ||
        (rc = get_hw(vs, "min", name, ds->info.size_min)) < 0 ||
        (rc = get_hw(vs, "median", name, ds->info.size_median)) < 0 ||
        (rc = get_hw(vs, "max", name, ds->info.size_max)) < 0)
        return rc;
    ds->info.max_side = (uint32_t)max_side;
    return 0;
}

/* Optional "files": what pack skipped and ignored in an image folder. */
static int parse_files(struct rt_dataset *ds, json_t *root, const char *name)
{
    json_t *f = json_object_get(root, "files");
    uint64_t n;
    int rc;

    if (!f)
        return 0;
    if (!json_is_object(f))
        return rt_errf(-EBADMSG, "%s: \"files\" is not an object", name);
    if ((rc = get_uint(f, "ignored", UINT32_MAX, name, "files", &ds->info.ignored_files)) < 0)
        return rc;
    json_t *sk = json_object_get(f, "skipped");
    if (!json_is_array(sk))
        return rt_errf(-EBADMSG, "%s: \"files\": \"skipped\" must be a list", name);
    n = json_array_size(sk);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(sk, i);
        if (!get_string(e, "file") || !get_string(e, "reason"))
            return rt_errf(-EBADMSG, "%s: \"files\": \"skipped\"[%zu] needs \"file\" and \"reason\"", name, i);
    }
    ds->info.skipped_files = n;
    return 0;
}

int rt_dataset_parse_manifest(const char *dir, const char *text, size_t len, const char *name,
                              struct rt_dataset **out)
{
    struct rt_dataset *ds;
    json_error_t jerr;
    json_t *root, *shape, *classes, *splits, *v;
    const char *s;
    uint64_t version = 0, nc = 0;
    int rc = -EBADMSG;

    ds = rt_calloc(1, sizeof(*ds), "dataset");
    if (!ds)
        return -ENOMEM;
    ds->dir = strdup(dir ? dir : ".");
    if (!ds->dir) {
        rc = rt_errf(-ENOMEM, "out of memory");
        goto err;
    }
    ds->info.dir = ds->dir;
    root = ds->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        rc = rt_errf(-EBADMSG, "%s: line %d, column %d: not valid JSON: %s", name, jerr.line, jerr.column,
                     jerr.text);
        goto err;
    }
    if (!json_is_object(root)) {
        rt_errf(-EBADMSG, "%s: top level is not a JSON object", name);
        goto err;
    }
    s = get_string(root, "format");
    if (!s || strcmp(s, RT_MANIFEST_FORMAT) != 0) {
        rt_errf(-EBADMSG, "%s: \"format\" is not \"%s\": not a ringtrain dataset manifest", name,
                RT_MANIFEST_FORMAT);
        goto err;
    }
    if ((rc = get_uint(root, "version", 1u << 30, name, "manifest", &version)) < 0)
        goto err;
    if (version != RT_MANIFEST_VERSION) {
        rc = rt_errf(version > RT_MANIFEST_VERSION ? -EPROTONOSUPPORT : -EBADMSG,
                     "%s: manifest version %" PRIu64 "%s; this build reads version %d", name, version,
                     version > RT_MANIFEST_VERSION ? " was written by a newer ringtrain" : "",
                     RT_MANIFEST_VERSION);
        goto err;
    }
    rc = -EBADMSG;
    ds->info.source = get_string(root, "source");
    if (!ds->info.source)
        ds->info.source = "unknown";
    s = get_string(root, "codec");
    if (s && strcmp(s, "raw") == 0) {
        ds->info.codec = RT_CODEC_RAW;
    } else if (s && strcmp(s, "jpeg") == 0) {
        ds->info.codec = RT_CODEC_JPEG;
    } else {
        rt_errf(-EBADMSG, "%s: \"codec\" must be \"raw\" or \"jpeg\"", name);
        goto err;
    }
    shape = json_object_get(root, "shape");
    if (!json_is_array(shape) || json_array_size(shape) != 3) {
        rt_errf(-EBADMSG, "%s: \"shape\" must be [channels, height, width]", name);
        goto err;
    }
    for (size_t i = 0; i < 3; i++) {
        v = json_array_get(shape, i);
        json_int_t d = json_is_integer(v) ? json_integer_value(v) : -1;
        /* Height and width 0: variable-size JPEG records. */
        json_int_t lo = i == 0 || ds->info.codec != RT_CODEC_JPEG ? 1 : 0;
        if (d < lo || d > (i == 0 ? RT_MAX_CHANNELS : RT_MAX_DIM)) {
            rt_errf(-EBADMSG, "%s: \"shape\"[%zu] out of range", name, i);
            goto err;
        }
        uint32_t *dst[3] = {&ds->info.channels, &ds->info.height, &ds->info.width};
        *dst[i] = (uint32_t)d;
    }
    if ((ds->info.height == 0) != (ds->info.width == 0)) {
        rt_errf(-EBADMSG, "%s: \"shape\" [%u, %u, %u]: height and width are both 0 (variable size) or neither",
                name, ds->info.channels, ds->info.height, ds->info.width);
        goto err;
    }
    if ((rc = parse_variable(ds, root, name)) < 0 || (rc = parse_files(ds, root, name)) < 0)
        goto err;
    rc = -EBADMSG;
    if ((rc = parse_norm(ds, root, name)) < 0)
        goto err;
    if ((rc = get_uint(root, "num_classes", RT_MAX_CLASSES, name, "manifest", &nc)) < 0)
        goto err;
    rc = -EBADMSG;
    if (nc == 0) {
        rt_errf(-EBADMSG, "%s: \"num_classes\" is 0", name);
        goto err;
    }
    ds->info.num_classes = (uint32_t)nc;
    classes = json_object_get(root, "classes");
    if (!json_is_array(classes) || json_array_size(classes) != nc) {
        rt_errf(-EBADMSG, "%s: \"classes\" must list %" PRIu64 " class names", name, nc);
        goto err;
    }
    ds->class_names = rt_calloc(nc, sizeof(char *), "class names");
    if (!ds->class_names) {
        rc = -ENOMEM;
        goto err;
    }
    for (size_t c = 0; c < nc; c++) {
        ds->class_names[c] = json_string_value(json_array_get(classes, c));
        if (!ds->class_names[c]) {
            rt_errf(-EBADMSG, "%s: \"classes\"[%zu] is not a string", name, c);
            goto err;
        }
    }
    ds->info.class_names = ds->class_names;
    splits = json_object_get(root, "splits");
    if (!json_is_object(splits)) {
        rt_errf(-EBADMSG, "%s: \"splits\" missing or not an object", name);
        goto err;
    }
    {
        const char *key;
        json_object_foreach(splits, key, v) {
            int known = 0;
            for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
                known |= strcmp(key, rt_split_name((enum rt_split)sp)) == 0;
            if (!known) {
                rt_errf(-EBADMSG, "%s: unknown split \"%s\" (expected train, val, test)", name, key);
                goto err;
            }
        }
    }
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        v = json_object_get(splits, rt_split_name((enum rt_split)sp));
        if (v && (rc = parse_split(ds, (enum rt_split)sp, v, name)) < 0)
            goto err;
    }
    if (ds->info.split[RT_SPLIT_TRAIN].records + ds->info.split[RT_SPLIT_VAL].records +
            ds->info.split[RT_SPLIT_TEST].records == 0) {
        rc = rt_errf(-EBADMSG, "%s: the dataset holds no records", name);
        goto err;
    }
    *out = ds;
    return 0;
err:
    rt_dataset_close(ds);
    return rc < 0 ? rc : -EBADMSG;
}

int rt_dataset_open(const char *dir, struct rt_dataset **out)
{
    char path[4096];
    uint8_t *text;
    size_t len;
    int rc;

    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, RT_MANIFEST_NAME) >= sizeof(path))
        return rt_errf(-ENAMETOOLONG, "%s: path too long", dir);
    rc = rt_file_read(path, &text, &len);
    if (rc < 0) {
        if (rc == -ENOENT)
            return rt_errf(rc, "%s: no %s here: not a packed dataset (make one with `ringtrain pack`)", dir,
                           RT_MANIFEST_NAME);
        return rc;
    }
    rc = rt_dataset_parse_manifest(dir, (const char *)text, len, path, out);
    free(text);
    return rc;
}

char *rt_manifest_dump(const struct rt_dataset_info *info, const double *mean, const double *std, json_t *extra,
                       json_t *pack)
{
    json_t *root = json_object(), *shape = json_array(), *classes = json_array(), *splits = json_object();
    json_t *jmean = json_array(), *jstd = json_array();
    char *text = NULL;

    if (!root || !shape || !classes || !splits || !jmean || !jstd)
        goto out;
    json_object_set_new(root, "format", json_string(RT_MANIFEST_FORMAT));
    json_object_set_new(root, "version", json_integer(RT_MANIFEST_VERSION));
    json_object_set_new(root, "source", json_string(info->source));
    json_object_set_new(root, "codec", json_string(rt_codec_name(info->codec)));
    json_array_append_new(shape, json_integer(info->channels));
    json_array_append_new(shape, json_integer(info->height));
    json_array_append_new(shape, json_integer(info->width));
    json_object_set(root, "shape", shape);
    {
        const char *key;
        json_t *v;
        json_object_foreach(extra, key, v) json_object_set(root, key, v);
    }
    if (mean && std) {
        for (uint32_t c = 0; c < info->channels; c++) {
            json_array_append_new(jmean, json_real(mean[c]));
            json_array_append_new(jstd, json_real(std[c]));
        }
        json_object_set(root, "mean", jmean);
        json_object_set(root, "std", jstd);
    }
    json_object_set_new(root, "num_classes", json_integer(info->num_classes));
    for (uint32_t c = 0; c < info->num_classes; c++)
        json_array_append_new(classes, json_string(info->class_names[c]));
    json_object_set(root, "classes", classes);
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        const struct rt_split_info *si = &info->split[sp];
        json_t *js, *counts, *shards;
        if (si->records == 0)
            continue;
        js = json_object();
        counts = json_array();
        shards = json_array();
        json_object_set_new(js, "records", json_integer((json_int_t)si->records));
        for (uint32_t c = 0; c < info->num_classes; c++)
            json_array_append_new(counts, json_integer((json_int_t)si->class_counts[c]));
        json_object_set_new(js, "class_counts", counts);
        for (uint32_t i = 0; i < si->nshards; i++) {
            const struct rt_shard_ref *r = &si->shards[i];
            char hex[17];
            json_t *o = json_object();
            snprintf(hex, sizeof(hex), "%016" PRIx64, r->xxh64);
            json_object_set_new(o, "file", json_string(r->file));
            json_object_set_new(o, "records", json_integer((json_int_t)r->records));
            json_object_set_new(o, "bytes", json_integer((json_int_t)r->bytes));
            json_object_set_new(o, "xxh64", json_string(hex));
            json_array_append_new(shards, o);
        }
        json_object_set_new(js, "shards", shards);
        json_object_set_new(splits, rt_split_name((enum rt_split)sp), js);
    }
    json_object_set(root, "splits", splits);
    if (pack)
        json_object_set(root, "pack", pack);
    text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
out:
    if (!text)
        rt_errf(-ENOMEM, "out of memory writing the manifest");
    json_decref(shape);
    json_decref(jmean);
    json_decref(jstd);
    json_decref(classes);
    json_decref(splits);
    json_decref(root);
    return text;
}
