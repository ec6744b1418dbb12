/*
 * source_folder.c - an image folder as torchvision's ImageFolder reads it:
 * ROOT/<class>/<file>, class index = position of the folder name in
 * byte-sorted order, files whose extension ImageFolder accepts
 * (rt_img_name_listed). ROOT/train/<class>/... with ROOT/val/... and/or
 * ROOT/test/... is read as those splits. Hidden files and other names are
 * left out and counted. Only the listing happens here: pack's workers read
 * and decode the files and decide what a file that is no image means.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/common.h"
#include "loader/imgfile.h"
#include "loader/source.h"

struct strlist {
    char **v;
    size_t n, cap;
};

static int strlist_push(struct strlist *l, const char *s)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        char **v = rt_realloc(l->v, cap * sizeof(char *), "file list");
        if (!v)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(s)))
        return rt_errf(-ENOMEM, "out of memory");
    l->n++;
    return 0;
}

static void strlist_free(struct strlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof(*l));
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Files left out of a listing: hidden ones and names that are no image's. */
struct ignored {
    uint64_t hidden, other;
    char example[128];
};

static void ignore(struct ignored *ig, const char *dir, const char *name, int hidden)
{
    if (hidden)
        ig->hidden++;
    else
        ig->other++;
    /* A name that is no image says more than a hidden file: prefer the first of those. */
    if (!ig->example[0] || (!hidden && ig->other == 1)) {
        const char *cls = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
        int n = snprintf(ig->example, sizeof(ig->example), "%.60s/%.60s", cls, name);
        (void)n;
    }
}

/* Sorted names in `dir`: subdirectories (want_dirs) or image files (`ig` counts the rest). */
static int list_dir(const char *dir, int want_dirs, struct strlist *out, struct ignored *ig)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int rc = 0;

    if (!d)
        return rt_errf(-errno, "%s: cannot read directory: %s", dir, strerror(errno));
    while ((e = readdir(d)) != NULL) {
        char path[4096 + 256];
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (e->d_name[0] == '.') {
            if (!want_dirs && ig)
                ignore(ig, dir, e->d_name, 1);
            continue;
        }
        if ((rc = rt_path_join(path, sizeof(path), dir, e->d_name)) < 0)
            break;
        int d_is_dir = is_dir(path);
        if (want_dirs ? d_is_dir : (!d_is_dir && rt_img_name_listed(e->d_name))) {
            if ((rc = strlist_push(out, e->d_name)) < 0)
                break;
        } else if (!want_dirs && ig) {
            ignore(ig, dir, e->d_name, 0);
        }
    }
    closedir(d);
    if (rc == 0 && out->n > 1)
        qsort(out->v, out->n, sizeof(char *), cmp_str);
    return rc;
}

/* Lists dir/<class>/<file> into paths/labels using the class list `classes`. */
static int list_split(const char *dir, const struct strlist *classes, int define_classes, struct strlist *paths,
                      int32_t **labels, struct ignored *ig)
{
    struct strlist sub = {0};
    int rc = list_dir(dir, 1, &sub, NULL);
    size_t nlab = 0;

    for (size_t i = 0; rc == 0 && i < sub.n; i++) {
        size_t cls = 0;
        while (cls < classes->n && strcmp(classes->v[cls], sub.v[i]) != 0)
            cls++;
        if (cls == classes->n) {
            rc = rt_errf(-EINVAL, "%s/%s: class folder not present in the training split", dir, sub.v[i]);
            break;
        }
        char cdir[4096];
        struct strlist files = {0};
        rc = rt_path_join(cdir, sizeof(cdir), dir, sub.v[i]);
        if (rc == 0)
            rc = list_dir(cdir, 0, &files, ig);
        if (rc == 0 && files.n == 0 && define_classes)
            rt_warn("%s: class folder holds no images (.jpg, .jpeg, .png, .webp, .ppm, .pgm, ...); the class "
                    "is kept, with no training records", cdir);
        int32_t *nl = rc == 0 ? rt_realloc(*labels, (nlab + files.n + 1) * sizeof(int32_t), "labels") : NULL;
        if (rc == 0 && !nl)
            rc = -ENOMEM;
        if (nl)
            *labels = nl;
        for (size_t f = 0; rc == 0 && f < files.n; f++) {
            char path[8300];
            rc = rt_path_join(path, sizeof(path), cdir, files.v[f]);
            if (rc == 0)
                rc = strlist_push(paths, path);
            if (rc == 0)
                (*labels)[nlab++] = (int32_t)cls;
        }
        strlist_free(&files);
    }
    strlist_free(&sub);
    return rc;
}

int rt_folder_open(const char *root, struct rt_source **out)
{
    static const char *const split_dir[RT_SPLIT_COUNT] = {"train", "val", "test"};
    struct rt_source_info info = {0};
    struct strlist classes = {0}, paths[RT_SPLIT_COUNT] = {{0}};
    int32_t *labels[RT_SPLIT_COUNT] = {0};
    char **pathv[RT_SPLIT_COUNT] = {0};
    char dirs[RT_SPLIT_COUNT][4096];
    struct ignored ig = {0};
    int rc;
    int nested;

    snprintf(dirs[RT_SPLIT_TRAIN], sizeof(dirs[0]), "%s/train", root);
    nested = is_dir(dirs[RT_SPLIT_TRAIN]);
    if (!nested)
        snprintf(dirs[RT_SPLIT_TRAIN], sizeof(dirs[0]), "%s", root);
    rc = list_dir(dirs[RT_SPLIT_TRAIN], 1, &classes, NULL);
    if (rc < 0)
        goto out;
    if (classes.n == 0) {
        rc = rt_errf(-EINVAL, "%s: not a dataset ringtrain knows: no CIFAR-10/100 (binary or python) or MNIST "
                     "files, and no class folders of an image folder (ROOT/<class>/<image file>)", root);
        goto out;
    }
    snprintf(info.kind, sizeof(info.kind), "image-folder");
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        if (sp != RT_SPLIT_TRAIN) {
            snprintf(dirs[sp], sizeof(dirs[0]), "%s/%s", root, split_dir[sp]);
            if (!nested || !is_dir(dirs[sp]))
                continue;
        }
        rc = list_split(dirs[sp], &classes, sp == RT_SPLIT_TRAIN, &paths[sp], &labels[sp], &ig);
        if (rc < 0)
            goto out;
        info.count[sp] = paths[sp].n;
    }
    if (info.count[RT_SPLIT_TRAIN] == 0) {
        rc = rt_errf(-EINVAL, "%s: no image files (.jpg, .jpeg, .png, .webp, .ppm, .pgm, ...) in the class folders",
                     dirs[RT_SPLIT_TRAIN]);
        goto out;
    }
    info.ignored_hidden = ig.hidden;
    info.ignored_other = ig.other;
    snprintf(info.ignored_example, sizeof(info.ignored_example), "%s", ig.example);
    /* Pack decides the stored size: the images' own, --size, or each its own (--max-side). */
    info.channels = 3;
    info.num_classes = (uint32_t)classes.n;
    info.class_names = classes.v;
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        pathv[sp] = paths[sp].v;
        paths[sp].v = NULL;
        paths[sp].n = 0;
    }
    classes.v = NULL;
    classes.n = 0;
    rc = rt_source_from_files(out, &info, pathv, labels);
    if (rc == 0) {
        memset(labels, 0, sizeof(labels));
        memset(pathv, 0, sizeof(pathv));
        info.class_names = NULL;
    }
out:
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        if (pathv[sp])
            for (uint64_t i = 0; i < info.count[sp]; i++)
                free(pathv[sp][i]);
        free(pathv[sp]);
        strlist_free(&paths[sp]);
    }
    rt_source_parts_free(&info, NULL, labels);
    strlist_free(&classes);
    return rc;
}
