/*
 * work_sleep.c: threads that alternate a slice of CPU work and a sleep,
 * the shape of a latency-critical server between bursts. Run under
 * `ginza run --iokernel` beside `batch`: each sleep should give the core
 * back (the kthreads park), and batch should get it meanwhile.
 *
 * Prints one JSON line: the wall time, the work done, and (under Ginza)
 * the runtime's parks and grants from ginza_app_stats.
 *
 * Usage: work_sleep [threads] [rounds] [work_us] [sleep_us]
 *        (defaults 2 200 1000 4000)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../../include/ginza.h"

static int rounds = 200, work_us = 1000, sleep_us = 4000;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *body(void *arg)
{
	volatile uint64_t *sink = arg;
	for (int r = 0; r < rounds; r++) {
		uint64_t end = now_ns() + (uint64_t)work_us * 1000;
		while (now_ns() < end)
			(*sink)++;
		usleep(sleep_us);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int threads = argc > 1 ? atoi(argv[1]) : 2;
	if (argc > 2)
		rounds = atoi(argv[2]);
	if (argc > 3)
		work_us = atoi(argv[3]);
	if (argc > 4)
		sleep_us = atoi(argv[4]);
	if (threads < 1 || threads > 64 || rounds < 1) {
		fprintf(stderr, "usage: work_sleep [threads 1-64] [rounds] [work_us] [sleep_us]\n");
		return 2;
	}
	pthread_t t[64];
	uint64_t sinks[64] = {0};
	uint64_t t0 = now_ns();
	for (int i = 0; i < threads; i++)
		if (pthread_create(&t[i], NULL, body, &sinks[i]) != 0)
			return 1;
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	double wall_ms = (now_ns() - t0) / 1e6;
	struct ginza_app_stats s = {0};
	int ginza = ginza_app_stats && ginza_app_stats(&s) == 0;
	printf("{\"wall_ms\":%.1f,\"work_ms\":%.1f,\"ginza\":%s,\"parks\":%llu,\"grants\":%llu}\n",
	       wall_ms, threads * rounds * work_us / 1e3, ginza ? "true" : "false",
	       (unsigned long long)s.parks, (unsigned long long)s.grants);
	return 0;
}
