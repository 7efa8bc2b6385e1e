/*
 * More CPU-bound threads than `ginza run --kthreads 2` has kthreads, none
 * of which ever blocks or yields: preemption must still let every thread
 * run. 4 threads spin counting; the main thread's 50 ms sleep must end
 * within 500 ms, and every spinner must have counted within a second. A
 * spinner gives up after 5 s, so without preemption this fails with a
 * message instead of hanging.
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#define SPINNERS 4
#define GIVE_UP_NS 5000000000ull

static atomic_int stop;
static atomic_long counts[SPINNERS];
static atomic_int gave_up;

static void *spin(void *arg)
{
	int id = (int)(uintptr_t)arg;
	uint64_t end = now_ns() + GIVE_UP_NS;
	long n = 0;
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		n++;
		if ((n & 1023) == 0) {
			atomic_store_explicit(&counts[id], n,
					      memory_order_relaxed);
			if (now_ns() > end) {
				atomic_fetch_add(&gave_up, 1);
				break;
			}
		}
	}
	atomic_store(&counts[id], n);
	return NULL;
}

int main(void)
{
	pthread_t t[SPINNERS];
	for (int round = 0; round < 3; round++) {
		atomic_store(&stop, 0);
		for (int i = 0; i < SPINNERS; i++) {
			atomic_store(&counts[i], 0);
			PT(pthread_create(&t[i], NULL, spin, (void *)(uintptr_t)i));
		}
		uint64_t t0 = now_ns();
		usleep(50 * 1000);
		uint64_t woke = now_ns() - t0;
		/* Every spinner gets the CPU within a second (a loaded 2-CPU
		 * machine may take a while even on Linux alone). */
		long seen[SPINNERS];
		uint64_t wait_end = now_ns() + 1000000000ull;
		for (int i = 0; i < SPINNERS; i++) {
			while ((seen[i] = atomic_load(&counts[i])) == 0 &&
			       now_ns() < wait_end)
				usleep(1000);
		}
		atomic_store(&stop, 1);
		for (int i = 0; i < SPINNERS; i++)
			PT(pthread_join(t[i], NULL));
		CHECK(atomic_load(&gave_up) == 0,
		      "round %d: the main thread did not run for 5 s while %d "
		      "threads spun (no preemption?); its 50 ms sleep took "
		      "%.1f ms", round, SPINNERS, woke / 1e6);
		CHECK(woke < 500 * 1000 * 1000ull,
		      "round %d: a 50 ms sleep beside %d spinning threads took "
		      "%.1f ms", round, SPINNERS, woke / 1e6);
		for (int i = 0; i < SPINNERS; i++)
			CHECK(seen[i] > 0,
			      "round %d: spinner %d had not run after 1 s", round,
			      i);
		fprintf(stderr, "round %d: main woke after %.1f ms\n", round,
			woke / 1e6);
	}
	PASS("preempt_spin");
}
