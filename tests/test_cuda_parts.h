/*
 * test_cuda_parts.h - the GPU tests that share test_cuda_ops's executable, each a part with its own
 * arguments: `test_cuda_ops twins-elem`, `test_cuda_ops twins-bn [--stand-in | --quick]`, `test_cuda_ops conv
 * [--rules] [-v]`. One executable because each links the whole CUDA backend (its kernels for three GPU
 * architectures, about 5 MiB stripped), and the kit that carries the GPU tests to a GPU machine has a size
 * limit. Each part's entry takes its own argv (argv[0] the part's name) and returns the test's exit code:
 * 0 pass, 1 fail, 77 skip.
 */
#ifndef RT_TESTS_TEST_CUDA_PARTS_H
#define RT_TESTS_TEST_CUDA_PARTS_H

int test_cuda_twins_elem_main(int argc, char **argv); /* tests/test_cuda_twins_elem.c */
int test_cuda_twins_bn_main(int argc, char **argv);   /* tests/test_cuda_twins_bn.c */
int test_cuda_conv_main(int argc, char **argv);       /* tests/test_cuda_conv.c */

#endif
