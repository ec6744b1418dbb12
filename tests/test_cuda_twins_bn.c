/* test_cuda_twins_bn.c - not written yet (skips). */
int main(void)
{
    return 77;
}
