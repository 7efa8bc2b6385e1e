/*
 * How long a wake of a thread blocked on another CPU takes on this
 * machine, with that CPU idle and with it kept busy by a SCHED_IDLE
 * spinner (docs/results.md, "Session 24"). On a VM an idle vCPU halts
 * and a wake must wait for the hypervisor to run it again.
 *
 *     cc -O2 -pthread -o /tmp/vcpu_wake bench/perf/vcpu_wake.c
 *     /tmp/vcpu_wake            # CPU 0 idle between wakes
 *     /tmp/vcpu_wake busy       # CPU 0 kept busy at SCHED_IDLE
 *
 * A waiter blocked in read(2) on an eventfd on CPU 0; a waker on CPU 1
 * that spins 100 µs (so CPU 0 has long gone idle), stamps the time and
 * writes the eventfd; the waiter stamps when it runs and answers on a
 * second eventfd. Prints the quantiles of write → waiter running.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

enum { WAKES = 20000, GAP_NS = 100000 };

static int to_waiter, to_waker;
static volatile uint64_t written_ns;
static volatile int stop_spinner;
static uint64_t latency_ns[WAKES];

static uint64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void pin(int cpu) {
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
		fprintf(stderr, "cannot pin to CPU %d\n", cpu);
		exit(1);
	}
}

static void *waiter(void *unused) {
	(void)unused;
	pin(0);
	for (int i = 0; i < WAKES; i++) {
		uint64_t v;
		if (read(to_waiter, &v, sizeof v) != sizeof v)
			exit(1);
		latency_ns[i] = now_ns() - written_ns;
		v = 1;
		if (write(to_waker, &v, sizeof v) != sizeof v)
			exit(1);
	}
	return NULL;
}

static void *spinner(void *unused) {
	(void)unused;
	pin(0);
	struct sched_param p = {0};
	if (sched_setscheduler(0, SCHED_IDLE, &p) != 0) {
		perror("SCHED_IDLE");
		exit(1);
	}
	while (!stop_spinner)
		;
	return NULL;
}

static int by_value(const void *a, const void *b) {
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv) {
	int busy = argc > 1 && strcmp(argv[1], "busy") == 0;
	to_waiter = eventfd(0, 0);
	to_waker = eventfd(0, 0);
	pthread_t w, s;
	if (busy)
		pthread_create(&s, NULL, spinner, NULL);
	pthread_create(&w, NULL, waiter, NULL);
	pin(1);
	for (int i = 0; i < WAKES; i++) {
		uint64_t until = now_ns() + GAP_NS, v = 1;
		while (now_ns() < until)
			;
		written_ns = now_ns();
		if (write(to_waiter, &v, sizeof v) != sizeof v)
			return 1;
		if (read(to_waker, &v, sizeof v) != sizeof v)
			return 1;
	}
	pthread_join(w, NULL);
	stop_spinner = 1;
	if (busy)
		pthread_join(s, NULL);
	qsort(latency_ns, WAKES, sizeof latency_ns[0], by_value);
	printf("wake of a thread on CPU 0 from CPU 1, CPU 0 %s: p50 %.1f p99 %.1f p99.9 %.1f max %.1f µs (%d wakes)\n",
	       busy ? "kept busy at SCHED_IDLE" : "idle", latency_ns[WAKES / 2] / 1e3,
	       latency_ns[WAKES * 99 / 100] / 1e3, latency_ns[WAKES * 999 / 1000] / 1e3,
	       latency_ns[WAKES - 1] / 1e3, WAKES);
	return 0;
}
