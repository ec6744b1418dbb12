/* test_cuda_twins_elem.c - not written yet (skips). */
int main(void)
{
    return 77;
}
