/* test_cuda_bodies_elem.cu - not written yet (skips). */
int main(void)
{
    return 77;
}
