/*
 * nanosleep, usleep, clock_nanosleep (relative, and TIMER_ABSTIME on
 * CLOCK_MONOTONIC) and sleep: each sleeps at least the time asked and, in
 * the median of its tries, less than 50 ms more (a loaded 2-CPU machine
 * may delay one try, so only the median has the tight bound; no try may
 * take a whole second more). The same from 4 threads sleeping at once,
 * and while 2 threads spin on the CPU. Invalid arguments give EINVAL.
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#define ASK_NS (10 * 1000 * 1000ull)
#define OVER_NS (50 * 1000 * 1000ull)
#define ABSURD_NS (1000 * 1000 * 1000ull)
#define TRIES 7

enum kind { NANOSLEEP, USLEEP, CLOCK_REL, CLOCK_ABS, KINDS };
static const char *names[] = {"nanosleep", "usleep",
			      "clock_nanosleep(CLOCK_MONOTONIC, 0)",
			      "clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)"};

static uint64_t sleep_once(enum kind k)
{
	struct timespec d = {0, (long)ASK_NS}, rem = {99, 99};
	uint64_t t0 = now_ns();
	switch (k) {
	case NANOSLEEP:
		CHECK(nanosleep(&d, &rem) == 0, "nanosleep: %s",
		      strerror(errno));
		break;
	case USLEEP:
		CHECK(usleep(ASK_NS / 1000) == 0, "usleep: %s", strerror(errno));
		break;
	case CLOCK_REL:
		PT(clock_nanosleep(CLOCK_MONOTONIC, 0, &d, &rem));
		break;
	case CLOCK_ABS: {
		struct timespec at;
		clock_gettime(CLOCK_MONOTONIC, &at);
		t0 = (uint64_t)at.tv_sec * 1000000000ull + (uint64_t)at.tv_nsec;
		at.tv_nsec += (long)ASK_NS;
		if (at.tv_nsec >= 1000000000L) {
			at.tv_sec++;
			at.tv_nsec -= 1000000000L;
		}
		PT(clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL));
		break;
	}
	default:
		break;
	}
	return now_ns() - t0;
}

static void check_kind(enum kind k, const char *when)
{
	uint64_t took[TRIES];
	for (int i = 0; i < TRIES; i++) {
		took[i] = sleep_once(k);
		CHECK(took[i] >= ASK_NS, "%s (%s) slept %.3f ms of 10 ms",
		      names[k], when, took[i] / 1e6);
		CHECK(took[i] < ASK_NS + ABSURD_NS,
		      "%s (%s): a 10 ms sleep took %.3f ms", names[k], when,
		      took[i] / 1e6);
	}
	uint64_t med = median_u64(took, TRIES);
	CHECK(med < ASK_NS + OVER_NS,
	      "%s (%s): median of %d 10 ms sleeps %.3f ms (max %.3f)",
	      names[k], when, TRIES, med / 1e6, took[TRIES - 1] / 1e6);
	fprintf(stderr, "%s (%s): median %.3f ms, max %.3f ms\n", names[k],
		when, med / 1e6, took[TRIES - 1] / 1e6);
}

static void *sleeper(void *arg)
{
	(void)arg;
	for (int k = 0; k < KINDS; k++)
		check_kind((enum kind)k, "4 threads at once");
	return NULL;
}

static atomic_int stop;

/* Spins without a system call until told to stop; gives up after 5 s so
 * that, without preemption, the sleeps fail with their figures instead of
 * the program hanging. */
static void *spinner(void *arg)
{
	(void)arg;
	uint64_t end = now_ns() + 5000000000ull;
	while (!atomic_load(&stop) && now_ns() < end)
		__asm__ __volatile__("" ::: "memory");
	return NULL;
}

int main(void)
{
	for (int k = 0; k < KINDS; k++)
		check_kind((enum kind)k, "alone");

	pthread_t t[4];
	for (int i = 0; i < 4; i++)
		PT(pthread_create(&t[i], NULL, sleeper, NULL));
	for (int i = 0; i < 4; i++)
		PT(pthread_join(t[i], NULL));

	pthread_t s[2];
	for (int i = 0; i < 2; i++)
		PT(pthread_create(&s[i], NULL, spinner, NULL));
	for (int k = 0; k < KINDS; k++)
		check_kind((enum kind)k, "beside 2 spinning threads");
	atomic_store(&stop, 1);
	for (int i = 0; i < 2; i++)
		PT(pthread_join(s[i], NULL));

	/* sleep(1): at least a second, less than 1.5. */
	uint64_t t0 = now_ns();
	CHECK(sleep(1) == 0, "sleep(1) returned early");
	uint64_t took = now_ns() - t0;
	CHECK(took >= 1000000000ull && took < 1500000000ull,
	      "sleep(1) took %.3f ms", took / 1e6);

	/* Zero-length sleeps return at once. */
	struct timespec zero = {0, 0};
	CHECK(nanosleep(&zero, NULL) == 0, "nanosleep(0): %s", strerror(errno));
	PT(clock_nanosleep(CLOCK_MONOTONIC, 0, &zero, NULL));

	struct timespec bad = {0, 1000000000L};
	errno = 0;
	CHECK(nanosleep(&bad, NULL) == -1 && errno == EINVAL,
	      "nanosleep with tv_nsec 1e9: errno %d", errno);
	CHECK_RC(clock_nanosleep(CLOCK_MONOTONIC, 0, &bad, NULL), EINVAL);
	PASS("sleep_accuracy");
}
