/*
 * fast_elem.cu - the CUDA backend's fast element-wise kernels (see cuda_be.h, rt_cuda_fast_elem_fill).
 * Not written yet: the tables keep the reference kernels of elem.cu.
 */
#include "compute/cuda/cuda_be.h"

void rt_cuda_fast_elem_fill(struct rt_ops *t, enum rt_dtype dt)
{
    (void)t;
    (void)dt;
}
