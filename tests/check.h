/*
 * check.h - the few macros ringtrain's C tests use. A failed CHECK prints the
 * file:line and the expression and marks the test failed; the test goes on so
 * one run shows every failure. main() ends with `return check_result();`:
 * exit 0 pass, 1 fail. A test that cannot run here exits 77 (ctest skip).
 */
#ifndef RT_TESTS_CHECK_H
#define RT_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures;
static int check_count;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        check_count++;                                                                 \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
            check_failures++;                                                          \
        }                                                                              \
    } while (0)

#define CHECKF(cond, ...)                                                              \
    do {                                                                               \
        check_count++;                                                                 \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
            check_failures++;                                                          \
        }                                                                              \
    } while (0)

/* Checks that rc == 0, printing rt_errmsg() (common.h) when not. */
#define CHECK_OK(expr)                                                                 \
    do {                                                                               \
        int check_rc_ = (expr);                                                        \
        check_count++;                                                                 \
        if (check_rc_ != 0) {                                                          \
            fprintf(stderr, "%s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #expr,  \
                    check_rc_, rt_errmsg());                                           \
            check_failures++;                                                          \
        }                                                                              \
    } while (0)

/* Checks that expr fails (< 0) and that the error message contains `needle`. */
#define CHECK_ERR(expr, needle)                                                        \
    do {                                                                               \
        int check_rc_ = (expr);                                                        \
        check_count++;                                                                 \
        if (check_rc_ >= 0) {                                                          \
            fprintf(stderr, "%s:%d: %s succeeded, expected an error with '%s'\n",      \
                    __FILE__, __LINE__, #expr, (needle));                              \
            check_failures++;                                                          \
        } else if (!strstr(rt_errmsg(), (needle))) {                                   \
            fprintf(stderr, "%s:%d: %s: message '%s' lacks '%s'\n", __FILE__, __LINE__, \
                    #expr, rt_errmsg(), (needle));                                     \
            check_failures++;                                                          \
        }                                                                              \
    } while (0)

static inline int check_result(void)
{
    fprintf(stderr, "%d checks, %d failed\n", check_count, check_failures);
    return check_failures ? 1 : 0;
}

#endif
