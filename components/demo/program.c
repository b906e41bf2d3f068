/*
 * The program the process demo splices while it runs, unmodified and unaware: it asks a
 * "policy" for a segment size for a few path MTUs, like the kernel's tcp_sync_mss, and sums a
 * series with compute().
 */
#include <stdio.h>

__attribute__((noinline)) unsigned int sync_mss(unsigned int pmtu)
{
	return pmtu - 52;
}

__attribute__((noinline)) long compute(long x)
{
	return 3 * x + 1;
}

int main(void)
{
	static const unsigned int mtus[] = { 1500, 9000, 65536 };
	long sum = 0;

	for (unsigned int i = 0; i < sizeof(mtus) / sizeof(mtus[0]); i++)
		printf("  sync_mss(%u) = %u\n", mtus[i], sync_mss(mtus[i]));
	for (long i = 0; i < 1000; i++)
		sum += compute(i);
	printf("  sum of compute(0..999) = %ld\n", sum);
	return 0;
}
