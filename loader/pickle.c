/*
 * pickle.c - a small reader for the CIFAR "python version" pickles
 * (cifar-10-batches-py/data_batch_N, test_batch, batches.meta;
 * cifar-100-python/train, test, meta) that never executes anything.
 *
 * What it does: runs the pickle opcode stream (protocols 0-5, as Python 2
 * cPickle and Python 3 write them) on a value stack, mark stack and memo of
 * its own. The result is a tree of plain values -- None, bool, int64, float,
 * str, bytes, list, tuple, dict -- plus inert "object" nodes that record a
 * whitelisted global together with its REDUCE/NEWOBJ arguments and BUILD
 * state. The CIFAR fields are then picked out of that tree and copied into
 * the caller's structs.
 *
 * The whitelist is exactly what numpy arrays and Python 3's protocol-0..2
 * bytes need: numpy.core.multiarray._reconstruct / .scalar, numpy.ndarray,
 * numpy.dtype, numpy.core.numeric._frombuffer (each also under numpy 2's
 * numpy._core spelling) and _codecs.encode. Two of them are evaluated on the
 * spot because their meaning is pure data: _codecs.encode(str, 'latin1')
 * becomes bytes and numpy scalar(int dtype, raw) becomes an int. The others
 * stay as object nodes that only the extraction step interprets.
 *
 * What it does not do: import, call or look up anything; any other global is
 * refused. Also refused: persistent ids, extension codes, out-of-band
 * buffers, INST/OBJ/NEWOBJ_EX, sets, integers beyond 64 bits, non-integer or
 * structured dtypes, big-endian multi-byte arrays, object arrays, fortran
 * order for arrays of more than one dimension, and bytes after STOP. str
 * values are not checked for valid UTF-8 except where they must be decoded.
 *
 * Hostile input: every length field is checked against the bytes left before
 * it is used, a decoded string is at most twice its encoded size, and the
 * node count, stack height, container items, memo size and mark depth have
 * fixed caps. Neither the VM nor the extraction recurses, so cyclic or deeply
 * nested values cannot exhaust the stack. Every node lives in one arena that
 * is freed in a single pass, so no error path can leak.
 *
 * Thread-safety: no shared state; each call uses its own arena.
 */
#include "pickle.h"

#include "common/common.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- limits ---------------------------------------------------------------- */

/*
 * A real CIFAR-100 train pickle has about 150k nodes (50k filenames and two
 * label lists), Python writers batch APPENDS/SETITEMS by 1000 so the stack
 * stays small, and marks nest only as deep as the data. The caps leave a
 * wide margin while keeping a hostile file's memory within ~200 MB.
 */
#define PK_MAX_NODES ((size_t)1 << 21)
#define PK_MAX_STACK ((size_t)1 << 20)
#define PK_MAX_ITEMS ((size_t)1 << 23)
#define PK_MAX_MEMO ((size_t)1 << 21)
#define PK_MEMO_SLACK ((size_t)4096)
#define PK_MAX_MARKS ((size_t)1024)
#define PK_MAX_DIMS 8
#define PK_BLOCK_NODES 1024

#define PK_IMAGE_BYTES 3072u /* 3 x 32 x 32 */

/* ---- opcodes ----------------------------------------------------------------- */

enum {
    OP_MARK = '(',
    OP_STOP = '.',
    OP_POP = '0',
    OP_POP_MARK = '1',
    OP_DUP = '2',
    OP_FLOAT = 'F',
    OP_INT = 'I',
    OP_BININT = 'J',
    OP_BININT1 = 'K',
    OP_LONG = 'L',
    OP_BININT2 = 'M',
    OP_NONE = 'N',
    OP_PERSID = 'P',
    OP_BINPERSID = 'Q',
    OP_REDUCE = 'R',
    OP_STRING = 'S',
    OP_BINSTRING = 'T',
    OP_SHORT_BINSTRING = 'U',
    OP_UNICODE = 'V',
    OP_BINUNICODE = 'X',
    OP_APPEND = 'a',
    OP_BUILD = 'b',
    OP_GLOBAL = 'c',
    OP_DICT = 'd',
    OP_EMPTY_DICT = '}',
    OP_APPENDS = 'e',
    OP_GET = 'g',
    OP_BINGET = 'h',
    OP_INST = 'i',
    OP_LONG_BINGET = 'j',
    OP_LIST = 'l',
    OP_EMPTY_LIST = ']',
    OP_OBJ = 'o',
    OP_PUT = 'p',
    OP_BINPUT = 'q',
    OP_LONG_BINPUT = 'r',
    OP_SETITEM = 's',
    OP_TUPLE = 't',
    OP_EMPTY_TUPLE = ')',
    OP_SETITEMS = 'u',
    OP_BINFLOAT = 'G',
    OP_PROTO = 0x80,
    OP_NEWOBJ = 0x81,
    OP_EXT1 = 0x82,
    OP_EXT2 = 0x83,
    OP_EXT4 = 0x84,
    OP_TUPLE1 = 0x85,
    OP_TUPLE2 = 0x86,
    OP_TUPLE3 = 0x87,
    OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89,
    OP_LONG1 = 0x8a,
    OP_LONG4 = 0x8b,
    OP_BINBYTES = 'B',
    OP_SHORT_BINBYTES = 'C',
    OP_SHORT_BINUNICODE = 0x8c,
    OP_BINUNICODE8 = 0x8d,
    OP_BINBYTES8 = 0x8e,
    OP_EMPTY_SET = 0x8f,
    OP_ADDITEMS = 0x90,
    OP_FROZENSET = 0x91,
    OP_NEWOBJ_EX = 0x92,
    OP_STACK_GLOBAL = 0x93,
    OP_MEMOIZE = 0x94,
    OP_FRAME = 0x95,
    OP_BYTEARRAY8 = 0x96,
    OP_NEXT_BUFFER = 0x97,
    OP_READONLY_BUFFER = 0x98,
};

static const char *op_name(uint8_t op)
{
    switch (op) {
    case OP_MARK: return "MARK";
    case OP_STOP: return "STOP";
    case OP_POP: return "POP";
    case OP_POP_MARK: return "POP_MARK";
    case OP_DUP: return "DUP";
    case OP_FLOAT: return "FLOAT";
    case OP_INT: return "INT";
    case OP_BININT: return "BININT";
    case OP_BININT1: return "BININT1";
    case OP_LONG: return "LONG";
    case OP_BININT2: return "BININT2";
    case OP_NONE: return "NONE";
    case OP_PERSID: return "PERSID";
    case OP_BINPERSID: return "BINPERSID";
    case OP_REDUCE: return "REDUCE";
    case OP_STRING: return "STRING";
    case OP_BINSTRING: return "BINSTRING";
    case OP_SHORT_BINSTRING: return "SHORT_BINSTRING";
    case OP_UNICODE: return "UNICODE";
    case OP_BINUNICODE: return "BINUNICODE";
    case OP_APPEND: return "APPEND";
    case OP_BUILD: return "BUILD";
    case OP_GLOBAL: return "GLOBAL";
    case OP_DICT: return "DICT";
    case OP_EMPTY_DICT: return "EMPTY_DICT";
    case OP_APPENDS: return "APPENDS";
    case OP_GET: return "GET";
    case OP_BINGET: return "BINGET";
    case OP_INST: return "INST";
    case OP_LONG_BINGET: return "LONG_BINGET";
    case OP_LIST: return "LIST";
    case OP_EMPTY_LIST: return "EMPTY_LIST";
    case OP_OBJ: return "OBJ";
    case OP_PUT: return "PUT";
    case OP_BINPUT: return "BINPUT";
    case OP_LONG_BINPUT: return "LONG_BINPUT";
    case OP_SETITEM: return "SETITEM";
    case OP_TUPLE: return "TUPLE";
    case OP_EMPTY_TUPLE: return "EMPTY_TUPLE";
    case OP_SETITEMS: return "SETITEMS";
    case OP_BINFLOAT: return "BINFLOAT";
    case OP_PROTO: return "PROTO";
    case OP_NEWOBJ: return "NEWOBJ";
    case OP_EXT1: return "EXT1";
    case OP_EXT2: return "EXT2";
    case OP_EXT4: return "EXT4";
    case OP_TUPLE1: return "TUPLE1";
    case OP_TUPLE2: return "TUPLE2";
    case OP_TUPLE3: return "TUPLE3";
    case OP_NEWTRUE: return "NEWTRUE";
    case OP_NEWFALSE: return "NEWFALSE";
    case OP_LONG1: return "LONG1";
    case OP_LONG4: return "LONG4";
    case OP_BINBYTES: return "BINBYTES";
    case OP_SHORT_BINBYTES: return "SHORT_BINBYTES";
    case OP_SHORT_BINUNICODE: return "SHORT_BINUNICODE";
    case OP_BINUNICODE8: return "BINUNICODE8";
    case OP_BINBYTES8: return "BINBYTES8";
    case OP_EMPTY_SET: return "EMPTY_SET";
    case OP_ADDITEMS: return "ADDITEMS";
    case OP_FROZENSET: return "FROZENSET";
    case OP_NEWOBJ_EX: return "NEWOBJ_EX";
    case OP_STACK_GLOBAL: return "STACK_GLOBAL";
    case OP_MEMOIZE: return "MEMOIZE";
    case OP_FRAME: return "FRAME";
    case OP_BYTEARRAY8: return "BYTEARRAY8";
    case OP_NEXT_BUFFER: return "NEXT_BUFFER";
    case OP_READONLY_BUFFER: return "READONLY_BUFFER";
    default: return NULL;
    }
}

/* ---- values ------------------------------------------------------------------ */

enum pk_kind {
    PK_NONE,
    PK_BOOL,
    PK_INT,
    PK_FLOAT,
    PK_STR,    /* Python 3 str / Python 2 unicode, UTF-8 */
    PK_BYTES,  /* Python 3 bytes or bytearray / Python 2 str */
    PK_LIST,
    PK_TUPLE,
    PK_DICT,   /* seq holds k0, v0, k1, v1, ... in insertion order */
    PK_GLOBAL, /* a whitelisted callable, never called */
    PK_OBJECT, /* global(*args) with optional BUILD state, never evaluated */
};

static const char *const kind_names[] = {
    "None", "bool", "int", "float", "str", "bytes", "list", "tuple", "dict", "global", "object",
};

enum pk_global {
    PG_RECONSTRUCT,
    PG_SCALAR,
    PG_NDARRAY,
    PG_DTYPE,
    PG_FROMBUFFER,
    PG_CODECS_ENCODE,
};

static const struct {
    const char *module, *name;
    enum pk_global global;
} whitelist[] = {
    {"numpy.core.multiarray", "_reconstruct", PG_RECONSTRUCT},
    {"numpy._core.multiarray", "_reconstruct", PG_RECONSTRUCT},
    {"numpy.core.multiarray", "scalar", PG_SCALAR},
    {"numpy._core.multiarray", "scalar", PG_SCALAR},
    {"numpy", "ndarray", PG_NDARRAY},
    {"numpy", "dtype", PG_DTYPE},
    {"numpy.core.numeric", "_frombuffer", PG_FROMBUFFER},
    {"numpy._core.numeric", "_frombuffer", PG_FROMBUFFER},
    {"_codecs", "encode", PG_CODECS_ENCODE},
};

struct pk_val {
    uint8_t kind;   /* enum pk_kind */
    uint8_t global; /* enum pk_global, for PK_GLOBAL and PK_OBJECT */
    size_t off;     /* byte offset of the opcode that made it, for messages */
    union {
        int64_t i; /* PK_BOOL (0/1), PK_INT */
        double f;
        struct {
            const uint8_t *p; /* into the input, or == own */
            size_t len;
            uint8_t *own;     /* decoded copy owned by the node, or NULL */
        } s;
        struct {
            struct pk_val **v;
            size_t n, cap;
        } seq;
        struct {
            struct pk_val *args, *state; /* state NULL until BUILD */
        } obj;
    } u;
};

struct pk_block {
    struct pk_block *next;
    size_t used;
    struct pk_val v[PK_BLOCK_NODES];
};

struct pk_vm {
    const char *name;
    const uint8_t *buf, *p, *end;
    size_t op_off; /* offset of the opcode being run */
    uint8_t op;

    struct pk_val **stack;
    size_t sp, stack_cap;
    size_t *marks; /* stack heights at each MARK */
    size_t nmarks, marks_cap;

    struct pk_val **memo; /* indexed by memo key; NULL = unset */
    size_t memo_cap, memo_count; /* slots allocated, keys set */

    struct pk_block *blocks;
    size_t nodes, items;
};

/* ---- messages ------------------------------------------------------------------ */

/* Copies untrusted text into `dst` printable, with \xHH escapes, cut short. */
static void excerpt(char *dst, size_t cap, const uint8_t *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k + 8 >= cap) {
            snprintf(dst + k, cap - k, "...");
            return;
        }
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\')
            dst[k++] = (char)p[i];
        else
            k += (size_t)snprintf(dst + k, cap - k, "\\x%02x", p[i]);
    }
    dst[k] = '\0';
}

static int vm_fail(struct pk_vm *vm, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sets "name: byte N: OPNAME: why" and returns -EBADMSG. */
static int vm_fail(struct pk_vm *vm, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    const char *op = op_name(vm->op);

    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (op)
        return rt_errf(-EBADMSG, "%s: byte %zu: %s: %s", vm->name, vm->op_off, op, why);
    return rt_errf(-EBADMSG, "%s: byte %zu: opcode 0x%02x: %s", vm->name, vm->op_off, vm->op, why);
}

/* Prefixes the allocator's -ENOMEM message with the file name. */
static int vm_nomem(const struct pk_vm *vm)
{
    return rt_errf(-ENOMEM, "%s: %s", vm->name, rt_errmsg());
}

static int bad(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sets "name: why" and returns -EBADMSG; used after the VM has finished. */
static int bad(const char *name, const char *fmt, ...)
{
    char why[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    return rt_errf(-EBADMSG, "%s: %s", name, why);
}

/* ---- arena, stack, memo -------------------------------------------------------- */

static int vm_new(struct pk_vm *vm, enum pk_kind kind, struct pk_val **out)
{
    struct pk_block *b = vm->blocks;
    struct pk_val *v;

    *out = NULL;
    if (vm->nodes >= PK_MAX_NODES)
        return vm_fail(vm, "more than %zu values: refusing to go on", PK_MAX_NODES);
    if (!b || b->used == PK_BLOCK_NODES) {
        b = rt_malloc(sizeof(*b), "pickle values");
        if (!b)
            return vm_nomem(vm);
        b->next = vm->blocks;
        b->used = 0;
        vm->blocks = b;
    }
    v = &b->v[b->used++];
    memset(v, 0, sizeof(*v));
    v->kind = (uint8_t)kind;
    v->off = vm->op_off;
    vm->nodes++;
    *out = v;
    return 0;
}

static size_t vm_base(const struct pk_vm *vm)
{
    return vm->nmarks ? vm->marks[vm->nmarks - 1] : 0;
}

static int vm_push(struct pk_vm *vm, struct pk_val *v)
{
    if (vm->sp == vm->stack_cap) {
        size_t cap = vm->stack_cap ? vm->stack_cap * 2 : 64;
        struct pk_val **s;
        if (vm->sp >= PK_MAX_STACK)
            return vm_fail(vm, "stack deeper than %zu values", PK_MAX_STACK);
        s = rt_realloc(vm->stack, cap * sizeof(*s), "pickle stack");
        if (!s)
            return vm_nomem(vm);
        vm->stack = s;
        vm->stack_cap = cap;
    }
    vm->stack[vm->sp++] = v;
    return 0;
}

/* Pops one value above the innermost mark; popping through a mark is an error. */
static int vm_pop(struct pk_vm *vm, struct pk_val **out)
{
    *out = NULL;
    if (vm->sp <= vm_base(vm))
        return vm_fail(vm, "stack underflow");
    *out = vm->stack[--vm->sp];
    return 0;
}

static int vm_top(struct pk_vm *vm, struct pk_val **out)
{
    *out = NULL;
    if (vm->sp <= vm_base(vm))
        return vm_fail(vm, "stack underflow");
    *out = vm->stack[vm->sp - 1];
    return 0;
}

/* Removes the innermost mark; the values above it are stack[*base .. sp). */
static int vm_pop_mark(struct pk_vm *vm, size_t *base)
{
    *base = vm->sp;
    if (vm->nmarks == 0)
        return vm_fail(vm, "no MARK on the stack");
    *base = vm->marks[--vm->nmarks];
    return 0;
}

/* Makes room for `add` more items in a list, tuple or dict. */
static int seq_reserve(struct pk_vm *vm, struct pk_val *s, size_t add)
{
    size_t need = s->u.seq.n + add;

    if (add > PK_MAX_ITEMS - vm->items)
        return vm_fail(vm, "more than %zu container items: refusing to go on", PK_MAX_ITEMS);
    if (need > s->u.seq.cap) {
        size_t cap = RT_MAX(need, RT_MAX(s->u.seq.cap * 2, (size_t)4));
        struct pk_val **v = rt_realloc(s->u.seq.v, cap * sizeof(*v), "pickle container");
        if (!v)
            return vm_nomem(vm);
        s->u.seq.v = v;
        s->u.seq.cap = cap;
    }
    vm->items += add;
    return 0;
}

/* Moves stack[from .. sp) into `s` (room reserved) and drops them from the stack. */
static void seq_take_stack(struct pk_vm *vm, struct pk_val *s, size_t from)
{
    size_t n = vm->sp - from;

    /* With n == 0 the stack may not be allocated yet: no pointer arithmetic on it. */
    if (n)
        memcpy(s->u.seq.v + s->u.seq.n, vm->stack + from, n * sizeof(*s->u.seq.v));
    s->u.seq.n += n;
    vm->sp = from;
}

/*
 * The memo is an array indexed by key. Every writer numbers memo entries in
 * order (Python 3 from 0, cPickle from 1), so a key far beyond the number of
 * entries set so far is refused: that keeps the array no larger than the
 * PUT opcodes justify (a LONG_BINPUT of 4e9 must not cost 32 GB) and every
 * memo operation O(1), where a hash table would let crafted keys collide.
 */
static int memo_put(struct pk_vm *vm, uint64_t key, struct pk_val *v)
{
    if (key >= PK_MAX_MEMO || key > vm->memo_count + PK_MEMO_SLACK)
        return vm_fail(vm, "memo index %" PRIu64 " is out of order (%zu entries so far)", key,
                       vm->memo_count);
    if (key >= vm->memo_cap) {
        size_t cap = RT_MIN(RT_MAX(vm->memo_cap * 2, (size_t)64), PK_MAX_MEMO);
        struct pk_val **m;

        cap = RT_MAX(cap, (size_t)key + 1);
        m = rt_realloc(vm->memo, cap * sizeof(*m), "pickle memo");
        if (!m)
            return vm_nomem(vm);
        memset(m + vm->memo_cap, 0, (cap - vm->memo_cap) * sizeof(*m));
        vm->memo = m;
        vm->memo_cap = cap;
    }
    vm->memo_count += vm->memo[key] == NULL;
    vm->memo[key] = v;
    return 0;
}

static void vm_free(struct pk_vm *vm)
{
    struct pk_block *b = vm->blocks;

    while (b) {
        struct pk_block *next = b->next;
        for (size_t i = 0; i < b->used; i++) {
            struct pk_val *v = &b->v[i];
            if (v->kind == PK_LIST || v->kind == PK_TUPLE || v->kind == PK_DICT)
                free(v->u.seq.v);
            else if (v->kind == PK_STR || v->kind == PK_BYTES)
                free(v->u.s.own);
        }
        free(b);
        b = next;
    }
    free(vm->stack);
    free(vm->marks);
    free(vm->memo);
    memset(vm, 0, sizeof(*vm));
}

/* ---- reading the stream ------------------------------------------------------- */

static size_t vm_left(const struct pk_vm *vm)
{
    return (size_t)(vm->end - vm->p);
}

/* Consumes `n` bytes; a length beyond the input is truncation, never an allocation. */
static int vm_take(struct pk_vm *vm, uint64_t n, const uint8_t **out)
{
    *out = vm->p;
    if (n > vm_left(vm))
        return vm_fail(vm, "truncated: needs %" PRIu64 " bytes, %zu left", n, vm_left(vm));
    *out = vm->p;
    vm->p += n;
    return 0;
}

static uint64_t le_bytes(const uint8_t *p, unsigned n)
{
    uint64_t u = 0;
    for (unsigned i = 0; i < n; i++)
        u |= (uint64_t)p[i] << (8 * i);
    return u;
}

/* Reads an n-byte little-endian unsigned argument (n = 1, 2, 4 or 8). */
static int vm_uarg(struct pk_vm *vm, unsigned n, uint64_t *out)
{
    const uint8_t *p;
    int rc = vm_take(vm, n, &p);

    *out = 0;
    if (rc)
        return rc;
    *out = le_bytes(p, n);
    return 0;
}

/* Reads a newline-terminated argument (protocol 0 style); the newline is dropped. */
static int vm_line(struct pk_vm *vm, const uint8_t **p, size_t *n)
{
    const uint8_t *nl = memchr(vm->p, '\n', vm_left(vm));

    *p = vm->p;
    *n = 0;
    if (!nl)
        return vm_fail(vm, "truncated: no newline ends the argument");
    *p = vm->p;
    *n = (size_t)(nl - vm->p);
    vm->p = nl + 1;
    return 0;
}

/* Parses [+-]digits into an int64. Returns 0, -1 (not a number) or -2 (overflow). */
static int parse_dec(const uint8_t *p, size_t n, int64_t *out)
{
    int neg = 0;
    uint64_t u = 0, lim;
    size_t i = 0;

    if (n && (p[0] == '-' || p[0] == '+')) {
        neg = p[0] == '-';
        i = 1;
    }
    if (i == n)
        return -1;
    lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; i < n; i++) {
        unsigned d = (unsigned)p[i] - '0';
        if (d > 9)
            return -1;
        if (u > (lim - d) / 10)
            return -2;
        u = u * 10 + d;
    }
    if (neg)
        *out = u == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)u;
    else
        *out = (int64_t)u;
    return 0;
}

/* Decodes a little-endian two's-complement integer of n bytes (LONG1/LONG4). */
static int decode_long(const uint8_t *p, size_t n, int64_t *out)
{
    size_t k = n < 8 ? n : 8;
    uint64_t u = le_bytes(p, (unsigned)k);
    int neg;

    if (n == 0) {
        *out = 0;
        return 0;
    }
    neg = (p[n - 1] & 0x80) != 0;
    if (n > 8) {
        for (size_t i = 8; i < n; i++)
            if (p[i] != (neg ? 0xff : 0x00))
                return -1;
        if ((int)(u >> 63) != neg)
            return -1;
    } else if (neg && k < 8) {
        u |= ~(uint64_t)0 << (8 * k);
    }
    memcpy(out, &u, sizeof(u));
    return 0;
}

/* ---- string decoders --------------------------------------------------------- */

static int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static size_t put_utf8(uint8_t *d, uint32_t cp)
{
    if (cp < 0x80) {
        d[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (uint8_t)(0xc0 | (cp >> 6));
        d[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (uint8_t)(0xe0 | (cp >> 12));
        d[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        d[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    d[0] = (uint8_t)(0xf0 | (cp >> 18));
    d[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    d[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    d[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* Pushes a PK_STR/PK_BYTES node that takes ownership of `own` (even on error). */
static int push_owned(struct pk_vm *vm, enum pk_kind kind, uint8_t *own, size_t len)
{
    struct pk_val *v;
    int rc = vm_new(vm, kind, &v);
    if (rc) {
        free(own);
        return rc;
    }
    v->u.s.p = own;
    v->u.s.len = len;
    v->u.s.own = own;
    return vm_push(vm, v);
}

/*
 * STRING: a quoted Python 2 repr, decoded like codecs.escape_decode. The
 * result is never longer than the argument.
 */
static int op_string(struct pk_vm *vm)
{
    const uint8_t *p;
    size_t n, k = 0;
    uint8_t *d;
    int rc = vm_line(vm, &p, &n);

    if (rc)
        return rc;
    /* Python 2 writes repr() and may pad with trailing spaces. */
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\r'))
        n--;
    if (n < 2 || (p[0] != '\'' && p[0] != '"') || p[n - 1] != p[0])
        return vm_fail(vm, "argument is not a quoted string");
    p++;
    n -= 2;
    d = rt_malloc(n, "pickle STRING");
    if (!d)
        return vm_nomem(vm);
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i++];
        if (c != '\\') {
            d[k++] = c;
            continue;
        }
        if (i == n) {
            free(d);
            return vm_fail(vm, "string ends in a lone backslash");
        }
        c = p[i++];
        switch (c) {
        case '\\': case '\'': case '"': d[k++] = c; break;
        case 'a': d[k++] = 7; break;
        case 'b': d[k++] = 8; break;
        case 'f': d[k++] = 12; break;
        case 'n': d[k++] = 10; break;
        case 'r': d[k++] = 13; break;
        case 't': d[k++] = 9; break;
        case 'v': d[k++] = 11; break;
        case 'x': {
            int hi = i + 2 <= n ? hexval(p[i]) : -1;
            int lo = i + 2 <= n ? hexval(p[i + 1]) : -1;
            if (hi < 0 || lo < 0) {
                free(d);
                return vm_fail(vm, "invalid \\x escape at string offset %zu", i - 2);
            }
            d[k++] = (uint8_t)(hi * 16 + lo);
            i += 2;
            break;
        }
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
            unsigned v = c - '0';
            for (int j = 0; j < 2 && i < n && p[i] >= '0' && p[i] <= '7'; j++)
                v = v * 8 + (p[i++] - '0');
            d[k++] = (uint8_t)(v & 0xff);
            break;
        }
        default:
            d[k++] = '\\';
            d[k++] = c;
            break;
        }
    }
    return push_owned(vm, PK_BYTES, d, k);
}

/*
 * UNICODE: raw-unicode-escape text, decoded to UTF-8. Only \u and \U are
 * escapes, and only after an odd run of backslashes; every other byte is a
 * Latin-1 code point. Each input byte yields at most two output bytes.
 */
static int op_unicode(struct pk_vm *vm)
{
    const uint8_t *p;
    size_t n, k = 0;
    uint8_t *d;
    int rc = vm_line(vm, &p, &n);

    if (rc)
        return rc;
    if (n > SIZE_MAX / 2)
        return vm_fail(vm, "argument too long");
    d = rt_malloc(2 * n, "pickle UNICODE");
    if (!d)
        return vm_nomem(vm);
    for (size_t i = 0; i < n;) {
        size_t start = i, run;
        unsigned digits;
        uint32_t cp = 0;

        if (p[i] != '\\') {
            k += put_utf8(d + k, p[i++]);
            continue;
        }
        while (i < n && p[i] == '\\')
            i++;
        run = i - start;
        if (run % 2 == 0 || i == n || (p[i] != 'u' && p[i] != 'U')) {
            memset(d + k, '\\', run);
            k += run;
            continue;
        }
        memset(d + k, '\\', run - 1);
        k += run - 1;
        digits = p[i] == 'u' ? 4 : 8;
        i++;
        if (n - i < digits) {
            free(d);
            return vm_fail(vm, "truncated \\u escape at text offset %zu", i - 2);
        }
        for (unsigned j = 0; j < digits; j++) {
            int h = hexval(p[i + j]);
            if (h < 0) {
                free(d);
                return vm_fail(vm, "invalid \\u escape at text offset %zu", i - 2);
            }
            cp = cp * 16 + (uint32_t)h;
        }
        if (cp > 0x10ffff) {
            free(d);
            return vm_fail(vm, "code point 0x%" PRIx32 " is out of range", cp);
        }
        i += digits;
        k += put_utf8(d + k, cp);
    }
    return push_owned(vm, PK_STR, d, k);
}

/* Pushes a str or bytes node pointing into the input. */
static int push_borrowed(struct pk_vm *vm, enum pk_kind kind, uint64_t len)
{
    struct pk_val *v;
    const uint8_t *p;
    int rc = vm_take(vm, len, &p);

    if (rc == 0)
        rc = vm_new(vm, kind, &v);
    if (rc)
        return rc;
    v->u.s.p = p;
    v->u.s.len = (size_t)len;
    return vm_push(vm, v);
}

/* A length-prefixed string or bytes opcode with an n-byte length. */
static int op_counted(struct pk_vm *vm, enum pk_kind kind, unsigned lenbytes, int is_signed)
{
    uint64_t len;
    int rc = vm_uarg(vm, lenbytes, &len);

    if (rc)
        return rc;
    if (is_signed && (len & 0x80000000u))
        return vm_fail(vm, "negative length %" PRId32, (int32_t)(uint32_t)len);
    return push_borrowed(vm, kind, len);
}

/* ---- text helpers for extraction ------------------------------------------------ */

static int is_text(const struct pk_val *v)
{
    return v && (v->kind == PK_STR || v->kind == PK_BYTES);
}

static int text_eq(const struct pk_val *v, const char *s)
{
    size_t n = strlen(s);
    return is_text(v) && v->u.s.len == n && memcmp(v->u.s.p, s, n) == 0;
}

/* ---- dtypes ---------------------------------------------------------------------- */

/* strchr() that does not match the terminating NUL. */
static int in_set(uint8_t c, const char *set)
{
    return c != '\0' && strchr(set, c) != NULL;
}

struct pk_dtype {
    char kind;         /* 'i' or 'u' */
    unsigned itemsize; /* 1, 2, 4 or 8 */
};

/*
 * Interprets a numpy.dtype object node: args ('u1', align, copy) and the
 * optional BUILD state (version, byteorder, subarray, names, fields, ...).
 * Only plain little-endian (or single-byte) integer dtypes are accepted.
 * On failure writes the reason into `why` and returns -1.
 */
static int dtype_parse(const struct pk_val *d, struct pk_dtype *dt, char *why, size_t whylen)
{
    const struct pk_val *code, *st = NULL;
    const uint8_t *p;
    size_t n, i = 0;
    char order = '=';
    char code_txt[64];

    if (!d || d->kind != PK_OBJECT || d->global != PG_DTYPE) {
        snprintf(why, whylen, "dtype is a %s, not numpy.dtype(...)",
                 d ? kind_names[d->kind] : "missing value");
        return -1;
    }
    if (d->u.obj.args->u.seq.n < 1 || !is_text(d->u.obj.args->u.seq.v[0])) {
        snprintf(why, whylen, "numpy.dtype(...) made at byte %zu has no type code", d->off);
        return -1;
    }
    code = d->u.obj.args->u.seq.v[0];
    p = code->u.s.p;
    n = code->u.s.len;
    excerpt(code_txt, sizeof(code_txt), p, n);
    if (n && in_set(p[0], "<>|=")) {
        order = (char)p[0];
        i = 1;
    }
    if (n - i != 2 || (p[i] != 'i' && p[i] != 'u') || !in_set(p[i + 1], "1248")) {
        snprintf(why, whylen, "dtype '%s' is not one of i1 i2 i4 i8 u1 u2 u4 u8", code_txt);
        return -1;
    }
    dt->kind = (char)p[i];
    dt->itemsize = (unsigned)(p[i + 1] - '0');
    st = d->u.obj.state;
    if (st) {
        if (st->kind != PK_TUPLE || st->u.seq.n < 2 || !is_text(st->u.seq.v[1]) ||
            st->u.seq.v[1]->u.s.len != 1 || !in_set(st->u.seq.v[1]->u.s.p[0], "<>|=")) {
            snprintf(why, whylen, "dtype '%s' has a state that is not (version, byteorder, ...)",
                     code_txt);
            return -1;
        }
        order = (char)st->u.seq.v[1]->u.s.p[0];
        for (size_t k = 2; k < 5 && k < st->u.seq.n; k++) {
            if (st->u.seq.v[k]->kind != PK_NONE) {
                snprintf(why, whylen, "dtype '%s' is structured or a subarray", code_txt);
                return -1;
            }
        }
    }
    if (order == '=' && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__)
        order = '>';
    if (order == '>' && dt->itemsize > 1) {
        snprintf(why, whylen, "dtype '%s' is big-endian", code_txt);
        return -1;
    }
    return 0;
}

/* Reads one little-endian integer element of `dt`. */
static int64_t dtype_read(const struct pk_dtype *dt, const uint8_t *p, int *too_big)
{
    uint64_t u = le_bytes(p, dt->itemsize);
    int64_t v;

    *too_big = 0;
    if (dt->kind == 'i') {
        if (dt->itemsize < 8 && (u >> (8 * dt->itemsize - 1)) & 1)
            u |= ~(uint64_t)0 << (8 * dt->itemsize);
        memcpy(&v, &u, sizeof(v));
        return v;
    }
    if (u > INT64_MAX) {
        *too_big = 1;
        return INT64_MAX;
    }
    return (int64_t)u;
}

/* ---- calls ---------------------------------------------------------------------- */

/* _codecs.encode(str, 'latin1'): how Python 3 writes bytes in protocols 0-2. */
static int call_codecs_encode(struct pk_vm *vm, const struct pk_val *args)
{
    const struct pk_val *s;
    uint8_t *d;
    size_t k = 0;

    if (args->u.seq.n != 2 || args->u.seq.v[0]->kind != PK_STR ||
        !(text_eq(args->u.seq.v[1], "latin1") || text_eq(args->u.seq.v[1], "latin-1")))
        return vm_fail(vm, "_codecs.encode arguments are not (str, 'latin1')");
    s = args->u.seq.v[0];
    d = rt_malloc(s->u.s.len, "pickle bytes");
    if (!d)
        return vm_nomem(vm);
    for (size_t i = 0; i < s->u.s.len;) {
        uint8_t c = s->u.s.p[i];
        if (c < 0x80) {
            d[k++] = c;
            i++;
        } else if ((c == 0xc2 || c == 0xc3) && i + 1 < s->u.s.len &&
                   (s->u.s.p[i + 1] & 0xc0) == 0x80) {
            d[k++] = (uint8_t)(((c & 0x1f) << 6) | (s->u.s.p[i + 1] & 0x3f));
            i += 2;
        } else {
            free(d);
            return vm_fail(vm, "_codecs.encode: text offset %zu is not a Latin-1 character", i);
        }
    }
    return push_owned(vm, PK_BYTES, d, k);
}

/* numpy scalar(dtype, raw bytes): kept only when it is an integer. */
static int call_scalar(struct pk_vm *vm, const struct pk_val *args)
{
    struct pk_dtype dt;
    struct pk_val *v;
    const struct pk_val *raw;
    char why[160];
    int too_big, rc;

    if (args->u.seq.n != 2)
        return vm_fail(vm, "numpy scalar arguments are not (dtype, bytes)");
    if (dtype_parse(args->u.seq.v[0], &dt, why, sizeof(why)))
        return vm_fail(vm, "numpy scalar: %s", why);
    raw = args->u.seq.v[1];
    if (raw->kind != PK_BYTES || raw->u.s.len != dt.itemsize)
        return vm_fail(vm, "numpy scalar data is not %u bytes", dt.itemsize);
    rc = vm_new(vm, PK_INT, &v);
    if (rc)
        return rc;
    v->u.i = dtype_read(&dt, raw->u.s.p, &too_big);
    if (too_big)
        return vm_fail(vm, "numpy scalar does not fit in 64 bits");
    return vm_push(vm, v);
}

/* REDUCE (newobj = 0) or NEWOBJ (newobj = 1) of `fn` with `args`. */
static int vm_call(struct pk_vm *vm, struct pk_val *fn, struct pk_val *args, int newobj)
{
    struct pk_val *o;
    int rc;

    if (fn->kind != PK_GLOBAL)
        return vm_fail(vm, "the callable is a %s, not a whitelisted global", kind_names[fn->kind]);
    if (args->kind != PK_TUPLE)
        return vm_fail(vm, "the arguments are a %s, not a tuple", kind_names[args->kind]);
    switch (fn->global) {
    case PG_CODECS_ENCODE:
        if (!newobj)
            return call_codecs_encode(vm, args);
        break;
    case PG_SCALAR:
        if (!newobj)
            return call_scalar(vm, args);
        break;
    case PG_RECONSTRUCT:
    case PG_FROMBUFFER:
        if (newobj)
            break;
        /* fall through */
    case PG_DTYPE:
        rc = vm_new(vm, PK_OBJECT, &o);
        if (rc)
            return rc;
        o->global = fn->global;
        o->u.obj.args = args;
        return vm_push(vm, o);
    case PG_NDARRAY:
        return vm_fail(vm, "constructing numpy.ndarray directly is not supported");
    default:
        break;
    }
    return vm_fail(vm, "this global cannot be used with %s", newobj ? "NEWOBJ" : "REDUCE");
}

static int push_global(struct pk_vm *vm, const uint8_t *mod, size_t modlen, const uint8_t *name,
                       size_t namelen)
{
    char m[96], n[96];

    for (size_t i = 0; i < RT_ARRAY_LEN(whitelist); i++) {
        const char *wm = whitelist[i].module, *wn = whitelist[i].name;
        if (strlen(wm) == modlen && memcmp(wm, mod, modlen) == 0 && strlen(wn) == namelen &&
            memcmp(wn, name, namelen) == 0) {
            struct pk_val *v;
            int rc = vm_new(vm, PK_GLOBAL, &v);
            if (rc)
                return rc;
            v->global = (uint8_t)whitelist[i].global;
            return vm_push(vm, v);
        }
    }
    excerpt(m, sizeof(m), mod, modlen);
    excerpt(n, sizeof(n), name, namelen);
    return vm_fail(vm, "global '%s.%s' is not allowed (only numpy array and bytes "
                       "reconstruction is)", m, n);
}

/* ---- the VM ---------------------------------------------------------------------- */

static int push_new(struct pk_vm *vm, enum pk_kind kind, int64_t i)
{
    struct pk_val *v;
    int rc = vm_new(vm, kind, &v);
    if (rc)
        return rc;
    v->u.i = i;
    return vm_push(vm, v);
}

/* Replaces the values above the innermost mark (and the mark) by one container. */
static int collect_mark(struct pk_vm *vm, enum pk_kind kind)
{
    struct pk_val *c;
    size_t base;
    int rc = vm_pop_mark(vm, &base);

    if (rc)
        return rc;
    if (kind == PK_DICT && (vm->sp - base) % 2)
        return vm_fail(vm, "odd number of values for a dict");
    rc = vm_new(vm, kind, &c);
    if (rc == 0)
        rc = seq_reserve(vm, c, vm->sp - base);
    if (rc)
        return rc;
    seq_take_stack(vm, c, base);
    return vm_push(vm, c);
}

/* APPENDS / SETITEMS: adds the values above the mark to the container below it. */
static int extend_mark(struct pk_vm *vm, enum pk_kind kind)
{
    struct pk_val *c;
    size_t base;
    int rc = vm_pop_mark(vm, &base);

    if (rc)
        return rc;
    if (base <= vm_base(vm))
        return vm_fail(vm, "stack underflow: no %s below the mark", kind_names[kind]);
    c = vm->stack[base - 1];
    if (c->kind != kind)
        return vm_fail(vm, "target is a %s, not a %s", kind_names[c->kind], kind_names[kind]);
    if (kind == PK_DICT && (vm->sp - base) % 2)
        return vm_fail(vm, "odd number of values for a dict");
    rc = seq_reserve(vm, c, vm->sp - base);
    if (rc)
        return rc;
    seq_take_stack(vm, c, base);
    return 0;
}

/* APPEND / SETITEM: pops `n` values and adds them to the container below. */
static int extend_top(struct pk_vm *vm, enum pk_kind kind, size_t n)
{
    struct pk_val *c;
    int rc;

    if (vm->sp - vm_base(vm) < n + 1)
        return vm_fail(vm, "stack underflow");
    c = vm->stack[vm->sp - n - 1];
    if (c->kind != kind)
        return vm_fail(vm, "target is a %s, not a %s", kind_names[c->kind], kind_names[kind]);
    rc = seq_reserve(vm, c, n);
    if (rc)
        return rc;
    seq_take_stack(vm, c, vm->sp - n);
    return 0;
}

static int tuple_n(struct pk_vm *vm, size_t n)
{
    struct pk_val *t;
    int rc;

    if (vm->sp - vm_base(vm) < n)
        return vm_fail(vm, "stack underflow");
    rc = vm_new(vm, PK_TUPLE, &t);
    if (rc == 0)
        rc = seq_reserve(vm, t, n);
    if (rc)
        return rc;
    seq_take_stack(vm, t, vm->sp - n);
    return vm_push(vm, t);
}

static int op_get(struct pk_vm *vm, uint64_t key)
{
    if (key >= vm->memo_cap || !vm->memo[key])
        return vm_fail(vm, "memo index %" PRIu64 " is missing", key);
    return vm_push(vm, vm->memo[key]);
}

static int op_put(struct pk_vm *vm, uint64_t key)
{
    struct pk_val *v;
    int rc = vm_top(vm, &v);
    if (rc)
        return rc;
    return memo_put(vm, key, v);
}

/* The argument of GET/PUT (protocol 0): a decimal memo index. */
static int line_index(struct pk_vm *vm, uint64_t *key)
{
    const uint8_t *p;
    size_t n;
    int64_t v;
    int rc = vm_line(vm, &p, &n);

    if (rc)
        return rc;
    if (parse_dec(p, n, &v) || v < 0)
        return vm_fail(vm, "memo index is not a non-negative decimal number");
    *key = (uint64_t)v;
    return 0;
}

/* INT (booleans I00/I01 included) and LONG (with its trailing 'L'). */
static int op_int_text(struct pk_vm *vm, int is_long)
{
    const uint8_t *p;
    size_t n;
    int64_t v;
    int rc = vm_line(vm, &p, &n);

    if (rc)
        return rc;
    if (!is_long && n == 2 && p[0] == '0' && (p[1] == '0' || p[1] == '1'))
        return push_new(vm, PK_BOOL, p[1] == '1');
    if (is_long && n && p[n - 1] == 'L')
        n--;
    rc = parse_dec(p, n, &v);
    if (rc == -2)
        return vm_fail(vm, "integer does not fit in 64 bits");
    if (rc)
        return vm_fail(vm, "argument is not a decimal integer");
    return push_new(vm, PK_INT, v);
}

static int op_float_text(struct pk_vm *vm)
{
    const uint8_t *p;
    size_t n;
    char tmp[64];
    char *endp;
    struct pk_val *v;
    int rc = vm_line(vm, &p, &n);

    if (rc)
        return rc;
    if (n == 0 || n >= sizeof(tmp) || memchr(p, '\0', n))
        return vm_fail(vm, "argument is not a float");
    memcpy(tmp, p, n);
    tmp[n] = '\0';
    double f = strtod(tmp, &endp);
    if (endp != tmp + n)
        return vm_fail(vm, "argument is not a float");
    rc = vm_new(vm, PK_FLOAT, &v);
    if (rc)
        return rc;
    v->u.f = f;
    return vm_push(vm, v);
}

static int op_long_bin(struct pk_vm *vm, unsigned lenbytes)
{
    uint64_t len;
    const uint8_t *p;
    int64_t v;
    int rc = vm_uarg(vm, lenbytes, &len);

    if (rc)
        return rc;
    if (lenbytes == 4 && (len & 0x80000000u))
        return vm_fail(vm, "negative length %" PRId32, (int32_t)(uint32_t)len);
    rc = vm_take(vm, len, &p);
    if (rc)
        return rc;
    if (decode_long(p, (size_t)len, &v))
        return vm_fail(vm, "integer does not fit in 64 bits");
    return push_new(vm, PK_INT, v);
}

static int op_binfloat(struct pk_vm *vm)
{
    const uint8_t *p;
    uint64_t u = 0;
    struct pk_val *v;
    int rc = vm_take(vm, 8, &p);

    if (rc)
        return rc;
    for (int i = 0; i < 8; i++)
        u = u << 8 | p[i];
    rc = vm_new(vm, PK_FLOAT, &v);
    if (rc)
        return rc;
    memcpy(&v->u.f, &u, sizeof(u));
    return vm_push(vm, v);
}

static int op_global_text(struct pk_vm *vm)
{
    const uint8_t *mod, *name;
    size_t modlen, namelen;
    int rc = vm_line(vm, &mod, &modlen);

    if (rc == 0)
        rc = vm_line(vm, &name, &namelen);
    if (rc)
        return rc;
    return push_global(vm, mod, modlen, name, namelen);
}

static int op_stack_global(struct pk_vm *vm)
{
    struct pk_val *mod, *name;
    int rc = vm_pop(vm, &name);

    if (rc == 0)
        rc = vm_pop(vm, &mod);
    if (rc)
        return rc;
    if (mod->kind != PK_STR || name->kind != PK_STR)
        return vm_fail(vm, "module and name are a %s and a %s, not str", kind_names[mod->kind],
                       kind_names[name->kind]);
    return push_global(vm, mod->u.s.p, mod->u.s.len, name->u.s.p, name->u.s.len);
}

static int op_call(struct pk_vm *vm, int newobj)
{
    struct pk_val *fn, *args;
    int rc = vm_pop(vm, &args);

    if (rc == 0)
        rc = vm_pop(vm, &fn);
    if (rc)
        return rc;
    return vm_call(vm, fn, args, newobj);
}

static int op_build(struct pk_vm *vm)
{
    struct pk_val *obj, *state;
    int rc = vm_pop(vm, &state);

    if (rc == 0)
        rc = vm_top(vm, &obj);
    if (rc)
        return rc;
    if (obj->kind != PK_OBJECT)
        return vm_fail(vm, "BUILD on a %s is not supported", kind_names[obj->kind]);
    obj->u.obj.state = state;
    return 0;
}

static int op_mark(struct pk_vm *vm)
{
    if (vm->nmarks == vm->marks_cap) {
        size_t cap = vm->marks_cap ? vm->marks_cap * 2 : 16;
        size_t *m;
        if (vm->nmarks >= PK_MAX_MARKS)
            return vm_fail(vm, "marks nested deeper than %zu", PK_MAX_MARKS);
        m = rt_realloc(vm->marks, cap * sizeof(*m), "pickle marks");
        if (!m)
            return vm_nomem(vm);
        vm->marks = m;
        vm->marks_cap = cap;
    }
    vm->marks[vm->nmarks++] = vm->sp;
    return 0;
}

static int op_pop(struct pk_vm *vm)
{
    /* As Python 3 does: POP with nothing above the mark discards the mark. */
    if (vm->sp > vm_base(vm)) {
        vm->sp--;
        return 0;
    }
    if (vm->nmarks) {
        vm->nmarks--;
        return 0;
    }
    return vm_fail(vm, "stack underflow");
}

static int vm_step(struct pk_vm *vm)
{
    struct pk_val *v;
    uint64_t u;
    size_t base;
    int rc;

    switch (vm->op) {
    case OP_MARK: return op_mark(vm);
    case OP_POP: return op_pop(vm);
    case OP_POP_MARK:
        rc = vm_pop_mark(vm, &base);
        if (rc == 0)
            vm->sp = base;
        return rc;
    case OP_DUP:
        rc = vm_top(vm, &v);
        return rc ? rc : vm_push(vm, v);

    case OP_NONE: return push_new(vm, PK_NONE, 0);
    case OP_NEWTRUE: return push_new(vm, PK_BOOL, 1);
    case OP_NEWFALSE: return push_new(vm, PK_BOOL, 0);
    case OP_INT: return op_int_text(vm, 0);
    case OP_LONG: return op_int_text(vm, 1);
    case OP_BININT:
        rc = vm_uarg(vm, 4, &u);
        return rc ? rc : push_new(vm, PK_INT, (int32_t)(uint32_t)u);
    case OP_BININT1:
    case OP_BININT2:
        rc = vm_uarg(vm, vm->op == OP_BININT1 ? 1 : 2, &u);
        return rc ? rc : push_new(vm, PK_INT, (int64_t)u);
    case OP_LONG1: return op_long_bin(vm, 1);
    case OP_LONG4: return op_long_bin(vm, 4);
    case OP_FLOAT: return op_float_text(vm);
    case OP_BINFLOAT: return op_binfloat(vm);

    case OP_STRING: return op_string(vm);
    case OP_BINSTRING: return op_counted(vm, PK_BYTES, 4, 1);
    case OP_SHORT_BINSTRING: return op_counted(vm, PK_BYTES, 1, 0);
    case OP_BINBYTES: return op_counted(vm, PK_BYTES, 4, 0);
    case OP_SHORT_BINBYTES: return op_counted(vm, PK_BYTES, 1, 0);
    case OP_BINBYTES8: return op_counted(vm, PK_BYTES, 8, 0);
    case OP_BYTEARRAY8: return op_counted(vm, PK_BYTES, 8, 0);
    case OP_UNICODE: return op_unicode(vm);
    case OP_BINUNICODE: return op_counted(vm, PK_STR, 4, 0);
    case OP_SHORT_BINUNICODE: return op_counted(vm, PK_STR, 1, 0);
    case OP_BINUNICODE8: return op_counted(vm, PK_STR, 8, 0);

    case OP_EMPTY_LIST: return push_new(vm, PK_LIST, 0);
    case OP_EMPTY_DICT: return push_new(vm, PK_DICT, 0);
    case OP_EMPTY_TUPLE: return push_new(vm, PK_TUPLE, 0);
    case OP_LIST: return collect_mark(vm, PK_LIST);
    case OP_TUPLE: return collect_mark(vm, PK_TUPLE);
    case OP_DICT: return collect_mark(vm, PK_DICT);
    case OP_TUPLE1: return tuple_n(vm, 1);
    case OP_TUPLE2: return tuple_n(vm, 2);
    case OP_TUPLE3: return tuple_n(vm, 3);
    case OP_APPEND: return extend_top(vm, PK_LIST, 1);
    case OP_APPENDS: return extend_mark(vm, PK_LIST);
    case OP_SETITEM: return extend_top(vm, PK_DICT, 2);
    case OP_SETITEMS: return extend_mark(vm, PK_DICT);

    case OP_PUT:
        rc = line_index(vm, &u);
        return rc ? rc : op_put(vm, u);
    case OP_BINPUT:
    case OP_LONG_BINPUT:
        rc = vm_uarg(vm, vm->op == OP_BINPUT ? 1 : 4, &u);
        return rc ? rc : op_put(vm, u);
    case OP_MEMOIZE: return op_put(vm, vm->memo_count);
    case OP_GET:
        rc = line_index(vm, &u);
        return rc ? rc : op_get(vm, u);
    case OP_BINGET:
    case OP_LONG_BINGET:
        rc = vm_uarg(vm, vm->op == OP_BINGET ? 1 : 4, &u);
        return rc ? rc : op_get(vm, u);

    case OP_GLOBAL: return op_global_text(vm);
    case OP_STACK_GLOBAL: return op_stack_global(vm);
    case OP_REDUCE: return op_call(vm, 0);
    case OP_NEWOBJ: return op_call(vm, 1);
    case OP_BUILD: return op_build(vm);

    case OP_PROTO:
        rc = vm_uarg(vm, 1, &u);
        if (rc == 0 && u > 5)
            rc = vm_fail(vm, "protocol %" PRIu64 " is newer than 5", u);
        return rc;
    case OP_FRAME:
        /* Frames only group opcodes for buffered reading; check and ignore. */
        rc = vm_uarg(vm, 8, &u);
        if (rc == 0 && u > vm_left(vm))
            rc = vm_fail(vm, "truncated: frame of %" PRIu64 " bytes, %zu left", u, vm_left(vm));
        return rc;

    case OP_PERSID:
    case OP_BINPERSID: return vm_fail(vm, "persistent ids are not supported");
    case OP_EXT1:
    case OP_EXT2:
    case OP_EXT4: return vm_fail(vm, "extension registry codes are not supported");
    case OP_NEXT_BUFFER:
    case OP_READONLY_BUFFER: return vm_fail(vm, "out-of-band buffers are not supported");
    case OP_INST:
    case OP_OBJ:
    case OP_NEWOBJ_EX: return vm_fail(vm, "instantiating classes is not supported");
    case OP_EMPTY_SET:
    case OP_ADDITEMS:
    case OP_FROZENSET: return vm_fail(vm, "sets are not supported");
    default: return vm_fail(vm, "unknown opcode");
    }
}

/*
 * Runs the whole stream. On success *top is the value STOP returned; it and
 * everything it refers to live until vm_free(). vm_free() is safe to call
 * whatever this returns.
 */
static int vm_run(struct pk_vm *vm, const void *buf, size_t len, const char *name,
                  struct pk_val **top)
{
    static const uint8_t empty[1];

    memset(vm, 0, sizeof(*vm));
    vm->name = name;
    vm->buf = buf ? buf : empty; /* NULL + 0 is undefined */
    vm->p = vm->buf;
    vm->end = vm->buf + len;
    while (vm->p < vm->end) {
        int rc;
        vm->op_off = (size_t)(vm->p - vm->buf);
        vm->op = *vm->p++;
        if (vm->op == OP_STOP) {
            rc = vm_pop(vm, top);
            if (rc == 0 && vm->p != vm->end)
                rc = vm_fail(vm, "%zu unexpected bytes after STOP", vm_left(vm));
            return rc;
        }
        rc = vm_step(vm);
        if (rc)
            return rc;
    }
    return rt_errf(-EBADMSG, "%s: byte %zu: truncated: the stream ends without STOP", name, len);
}

/* ---- extraction -------------------------------------------------------------------- */

/* Looks up a str or bytes key; the last occurrence wins, as in Python. */
static const struct pk_val *dict_get(const struct pk_val *d, const char *key)
{
    for (size_t i = d->u.seq.n; i >= 2; i -= 2)
        if (text_eq(d->u.seq.v[i - 2], key))
            return d->u.seq.v[i - 1];
    return NULL;
}

/* Runs the stream and checks that it pickled a dict; on error *vm still needs vm_free(). */
static int run_to_dict(struct pk_vm *vm, const void *buf, size_t len, const char *name, struct pk_val **top)
{
    int rc = vm_run(vm, buf, len, name, top);
    if (rc)
        return rc;
    if ((*top)->kind != PK_DICT)
        return bad(name, "the pickled object (byte %zu) is a %s, not a dict", (*top)->off,
                   kind_names[(*top)->kind]);
    return 0;
}

struct pk_array {
    const uint8_t *data;
    size_t nbytes;
    uint64_t shape[PK_MAX_DIMS];
    size_t ndim;
    uint64_t count;
    struct pk_dtype dt;
    int fortran;
};

static int shape_parse(const char *name, const char *what, const struct pk_val *s,
                       struct pk_array *a)
{
    if (s->kind != PK_TUPLE || s->u.seq.n > PK_MAX_DIMS)
        return bad(name, "%s: shape is a %s, not a tuple of at most %d ints", what,
                   kind_names[s->kind], PK_MAX_DIMS);
    a->ndim = s->u.seq.n;
    a->count = 1;
    for (size_t i = 0; i < a->ndim; i++) {
        const struct pk_val *d = s->u.seq.v[i];
        if (d->kind != PK_INT || d->u.i < 0)
            return bad(name, "%s: shape entry %zu is not a non-negative int", what, i);
        a->shape[i] = (uint64_t)d->u.i;
        if (__builtin_mul_overflow(a->count, a->shape[i], &a->count))
            return bad(name, "%s: shape overflows", what);
    }
    return 0;
}

static int array_data(const char *name, const char *what, const struct pk_val *raw,
                      struct pk_array *a)
{
    uint64_t want;

    if (raw->kind == PK_LIST)
        return bad(name, "%s: object arrays are not supported", what);
    if (raw->kind != PK_BYTES)
        return bad(name, "%s: array data is a %s, not bytes", what, kind_names[raw->kind]);
    if (__builtin_mul_overflow(a->count, (uint64_t)a->dt.itemsize, &want) ||
        want != raw->u.s.len)
        return bad(name, "%s: array data is %zu bytes, the shape and dtype need %" PRIu64 " x %u",
                   what, raw->u.s.len, a->count, a->dt.itemsize);
    a->data = raw->u.s.p;
    a->nbytes = raw->u.s.len;
    return 0;
}

/*
 * Interprets an object node as a numpy array: either
 *   _reconstruct(ndarray, (0,), b'b') + BUILD (version, shape, dtype, fortran, raw)
 *   (the version is absent in very old numpy), or
 *   _frombuffer(raw, dtype, shape, order)   (protocol 5, in-band).
 */
static int array_parse(const char *name, const char *what, const struct pk_val *v,
                       struct pk_array *a)
{
    const struct pk_val *args, *st, *shape, *dtype, *fort, *raw;
    char why[200];
    int rc;

    memset(a, 0, sizeof(*a));
    if (v->kind != PK_OBJECT || (v->global != PG_RECONSTRUCT && v->global != PG_FROMBUFFER))
        return bad(name, "%s (byte %zu) is a %s, not a numpy array", what, v->off,
                   kind_names[v->kind]);
    args = v->u.obj.args;
    st = v->u.obj.state;
    if (v->global == PG_RECONSTRUCT) {
        if (args->u.seq.n != 3 || args->u.seq.v[0]->kind != PK_GLOBAL ||
            args->u.seq.v[0]->global != PG_NDARRAY)
            return bad(name, "%s (byte %zu): _reconstruct arguments are not (numpy.ndarray, ...)",
                       what, v->off);
        if (!st || st->kind != PK_TUPLE || st->u.seq.n < 4 || st->u.seq.n > 5)
            return bad(name, "%s (byte %zu): array has no (version, shape, dtype, fortran, "
                             "data) state", what, v->off);
        size_t k = st->u.seq.n - 4;
        shape = st->u.seq.v[k];
        dtype = st->u.seq.v[k + 1];
        fort = st->u.seq.v[k + 2];
        raw = st->u.seq.v[k + 3];
        if (fort->kind != PK_BOOL && fort->kind != PK_INT)
            return bad(name, "%s (byte %zu): fortran flag is a %s", what, v->off,
                       kind_names[fort->kind]);
        a->fortran = fort->u.i != 0;
    } else {
        if (st)
            return bad(name, "%s (byte %zu): unexpected BUILD state on _frombuffer", what, v->off);
        if (args->u.seq.n != 4 ||
            !(text_eq(args->u.seq.v[3], "C") || text_eq(args->u.seq.v[3], "F")))
            return bad(name, "%s (byte %zu): _frombuffer arguments are not (buffer, dtype, "
                             "shape, 'C' or 'F')", what, v->off);
        raw = args->u.seq.v[0];
        dtype = args->u.seq.v[1];
        shape = args->u.seq.v[2];
        a->fortran = text_eq(args->u.seq.v[3], "F");
    }
    if (dtype_parse(dtype, &a->dt, why, sizeof(why)))
        return bad(name, "%s (byte %zu): %s", what, v->off, why);
    rc = shape_parse(name, what, shape, a);
    if (rc == 0)
        rc = array_data(name, what, raw, a);
    if (rc == 0 && a->fortran && a->ndim > 1)
        rc = bad(name, "%s (byte %zu): fortran-order arrays are not supported", what, v->off);
    return rc;
}

/* Labels: a list (or tuple) of ints, or a 1-D int numpy array; n values in [0, INT32_MAX]. */
static int labels_get(const char *name, const char *key, const struct pk_val *v, uint64_t n,
                      int32_t **out)
{
    struct pk_array a;
    int32_t *lab = NULL;
    char what[48];
    int is_list = v->kind == PK_LIST || v->kind == PK_TUPLE;
    int rc;

    snprintf(what, sizeof(what), "'%s'", key);
    if (is_list) {
        if (v->u.seq.n != n)
            return bad(name, "%s has %zu labels for %" PRIu64 " images", what, v->u.seq.n, n);
    } else {
        rc = array_parse(name, what, v, &a);
        if (rc)
            return rc;
        if (a.ndim != 1 || a.shape[0] != n)
            return bad(name, "%s has %" PRIu64 " labels in %zu dimensions for %" PRIu64 " images",
                       what, a.count, a.ndim, n);
    }
    lab = rt_malloc((size_t)n * sizeof(*lab), "CIFAR labels");
    if (!lab)
        return rt_errf(-ENOMEM, "%s: %s", name, rt_errmsg());
    for (size_t i = 0; i < n; i++) {
        int too_big = 0;
        int64_t x;
        if (is_list) {
            const struct pk_val *e = v->u.seq.v[i];
            if (e->kind != PK_INT) {
                rc = bad(name, "%s[%zu] is a %s, not an int", what, i, kind_names[e->kind]);
                goto err;
            }
            x = e->u.i;
        } else {
            x = dtype_read(&a.dt, a.data + i * a.dt.itemsize, &too_big);
        }
        if (too_big || x < 0 || x > INT32_MAX) {
            rc = bad(name, "%s[%zu] is %s%" PRId64 ", outside [0, %d]", what, i,
                     too_big ? ">" : "", x, INT32_MAX);
            goto err;
        }
        lab[i] = (int32_t)x;
    }
    *out = lab;
    return 0;
err:
    free(lab);
    return rc;
}

int rt_pickle_cifar_batch(const void *buf, size_t len, const char *name,
                          struct rt_cifar_py_batch *out)
{
    struct pk_vm vm;
    struct pk_val *top;
    const struct pk_val *data, *labels, *coarse;
    const char *lkey = "labels";
    struct pk_array a;
    struct rt_cifar_py_batch b = {0};
    int rc;

    if (!name)
        name = "pickle";
    if (!out || (!buf && len))
        return rt_errf(-EINVAL, "%s: rt_pickle_cifar_batch: NULL argument", name);
    memset(out, 0, sizeof(*out));
    rc = run_to_dict(&vm, buf, len, name, &top);
    if (rc)
        goto err;
    data = dict_get(top, "data");
    labels = dict_get(top, "labels");
    if (!labels) {
        lkey = "fine_labels";
        labels = dict_get(top, "fine_labels");
    }
    coarse = dict_get(top, "coarse_labels");
    if (!data || !labels) {
        rc = bad(name, "the dict has no '%s' key", !data ? "data" : "labels' or 'fine_labels");
        goto err;
    }
    rc = array_parse(name, "'data'", data, &a);
    if (rc)
        goto err;
    if (a.dt.kind != 'u' || a.dt.itemsize != 1) {
        rc = bad(name, "'data' (byte %zu): dtype is %c%u, not uint8", data->off, a.dt.kind,
                 a.dt.itemsize);
        goto err;
    }
    if (!((a.ndim == 2 && a.shape[1] == PK_IMAGE_BYTES) ||
          (a.ndim == 4 && a.shape[1] == 3 && a.shape[2] == 32 && a.shape[3] == 32)) ||
        a.shape[0] == 0) {
        rc = bad(name, "'data' (byte %zu): shape is not (n, 3072) or (n, 3, 32, 32) with n > 0",
                 data->off);
        goto err;
    }
    b.n = a.shape[0];
    rc = labels_get(name, lkey, labels, b.n, &b.labels);
    if (rc == 0 && coarse)
        rc = labels_get(name, "coarse_labels", coarse, b.n, &b.coarse);
    if (rc)
        goto err;
    b.data = rt_malloc(a.nbytes, "CIFAR images");
    if (!b.data) {
        rc = rt_errf(-ENOMEM, "%s: %s", name, rt_errmsg());
        goto err;
    }
    memcpy(b.data, a.data, a.nbytes);
    vm_free(&vm);
    *out = b;
    return 0;
err:
    rt_pickle_cifar_batch_free(&b);
    vm_free(&vm);
    return rc;
}

void rt_pickle_cifar_batch_free(struct rt_cifar_py_batch *b)
{
    if (!b)
        return;
    free(b->data);
    free(b->labels);
    free(b->coarse);
    memset(b, 0, sizeof(*b));
}

static void names_free(char **names, size_t n)
{
    if (!names)
        return;
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* A non-empty list (or tuple) of str/bytes without NULs, copied as C strings. */
static int names_get(const char *name, const char *key, const struct pk_val *v, char ***out,
                     size_t *nout)
{
    char **names;
    size_t n;

    if ((v->kind != PK_LIST && v->kind != PK_TUPLE) || v->u.seq.n == 0)
        return bad(name, "'%s' (byte %zu) is a %s, not a non-empty list of names", key, v->off,
                   kind_names[v->kind]);
    n = v->u.seq.n;
    for (size_t i = 0; i < n; i++) {
        const struct pk_val *e = v->u.seq.v[i];
        if (!is_text(e) || memchr(e->u.s.p, '\0', e->u.s.len))
            return bad(name, "'%s'[%zu] is not a str or bytes without NULs", key, i);
    }
    names = rt_calloc(n, sizeof(*names), "CIFAR label names");
    if (!names)
        return rt_errf(-ENOMEM, "%s: %s", name, rt_errmsg());
    for (size_t i = 0; i < n; i++) {
        const struct pk_val *e = v->u.seq.v[i];
        names[i] = rt_malloc(e->u.s.len + 1, "CIFAR label name");
        if (!names[i]) {
            names_free(names, n);
            return rt_errf(-ENOMEM, "%s: %s", name, rt_errmsg());
        }
        memcpy(names[i], e->u.s.p, e->u.s.len);
        names[i][e->u.s.len] = '\0';
    }
    *out = names;
    *nout = n;
    return 0;
}

int rt_pickle_cifar_meta(const void *buf, size_t len, const char *name,
                         struct rt_cifar_py_meta *out)
{
    struct pk_vm vm;
    struct pk_val *top;
    const struct pk_val *names, *coarse;
    const char *key = "label_names";
    struct rt_cifar_py_meta m = {0};
    int rc;

    if (!name)
        name = "pickle";
    if (!out || (!buf && len))
        return rt_errf(-EINVAL, "%s: rt_pickle_cifar_meta: NULL argument", name);
    memset(out, 0, sizeof(*out));
    rc = run_to_dict(&vm, buf, len, name, &top);
    if (rc)
        goto err;
    names = dict_get(top, key);
    if (!names) {
        key = "fine_label_names";
        names = dict_get(top, key);
    }
    if (!names) {
        rc = bad(name, "the dict has no 'label_names' or 'fine_label_names' key");
        goto err;
    }
    rc = names_get(name, key, names, &m.names, &m.n);
    if (rc)
        goto err;
    coarse = dict_get(top, "coarse_label_names");
    if (coarse) {
        rc = names_get(name, "coarse_label_names", coarse, &m.coarse_names, &m.ncoarse);
        if (rc)
            goto err;
    }
    vm_free(&vm);
    *out = m;
    return 0;
err:
    rt_pickle_cifar_meta_free(&m);
    vm_free(&vm);
    return rc;
}

void rt_pickle_cifar_meta_free(struct rt_cifar_py_meta *m)
{
    if (!m)
        return;
    names_free(m->names, m->n);
    names_free(m->coarse_names, m->ncoarse);
    memset(m, 0, sizeof(*m));
}
