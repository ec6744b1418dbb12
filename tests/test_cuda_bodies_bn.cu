/* test_cuda_bodies_bn.cu - not written yet (skips). */
int main(void)
{
    return 77;
}
