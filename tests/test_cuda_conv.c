/* test_cuda_conv.c - not written yet (skips). */
int main(void)
{
    return 77;
}
