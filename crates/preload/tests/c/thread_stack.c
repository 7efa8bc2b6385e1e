/*
 * A thread created with a 1 MiB stack size attribute uses ~900 KiB of
 * stack (a frame that is written through). With a smaller stack than
 * asked, this crashes. The attribute's getters return what was set, and
 * the thread sees its own stack, its size and where it lies, through
 * pthread_getattr_np.
 */
#include "check.h"
#include <pthread.h>

#define STACK (1024 * 1024)
#define USE (900 * 1024)

static __attribute__((noinline)) long deep(int seed)
{
	volatile unsigned char buf[USE];
	/* Touch every page, then read back a few bytes. */
	for (size_t i = 0; i < sizeof buf; i += 512)
		buf[i] = (unsigned char)(seed + i / 512);
	long sum = 0;
	for (size_t i = 0; i < sizeof buf; i += 4096)
		sum += buf[i];
	return sum;
}

static long expected(int seed)
{
	long sum = 0;
	for (size_t i = 0; i < USE; i += 4096)
		sum += (unsigned char)(seed + i / 512);
	return sum;
}

static void *body(void *arg)
{
	int seed = (int)(uintptr_t)arg;
	long sum = deep(seed);
	/* After the stack was used, so a failure here is told apart. */
	pthread_attr_t a;
	size_t size = 0;
	void *low = NULL;
	PT(pthread_getattr_np(pthread_self(), &a));
	PT(pthread_attr_getstack(&a, &low, &size));
	PT(pthread_attr_destroy(&a));
	CHECK(size >= STACK,
	      "pthread_getattr_np: the thread's stack is %zu bytes, asked %d",
	      size, STACK);
	char here;
	CHECK((char *)low <= &here && &here < (char *)low + size,
	      "pthread_getattr_np: the stack %p + %zu does not hold the "
	      "thread's own frame at %p",
	      low, size, (void *)&here);
	return (void *)(uintptr_t)sum;
}

int main(void)
{
	pthread_attr_t attr;
	size_t size = 0;
	PT(pthread_attr_init(&attr));
	PT(pthread_attr_setstacksize(&attr, STACK));
	PT(pthread_attr_getstacksize(&attr, &size));
	CHECK(size == STACK, "getstacksize %zu after setstacksize %d", size,
	      STACK);
	for (int round = 0; round < 8; round++) {
		pthread_t t[4];
		for (int i = 0; i < 4; i++)
			PT(pthread_create(&t[i], &attr, body,
					  (void *)(uintptr_t)(round * 4 + i)));
		for (int i = 0; i < 4; i++) {
			void *ret;
			PT(pthread_join(t[i], &ret));
			long want = expected(round * 4 + i);
			CHECK((long)(uintptr_t)ret == want,
			      "thread returned %ld, expected %ld",
			      (long)(uintptr_t)ret, want);
		}
	}
	PT(pthread_attr_destroy(&attr));
	PASS("thread_stack");
}
