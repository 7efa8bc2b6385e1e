/*
 * pthread_cond_broadcast wakes every waiter: 16 threads wait for a
 * generation number to change, the main thread bumps it and broadcasts,
 * 200 rounds; every thread sees every generation exactly once. Then
 * pthread_cond_signal with all 16 waiting wakes them one by one: exactly
 * one more thread passes per signal (each signal is given a permit).
 */
#include "check.h"
#include <pthread.h>

#define THREADS 16
#define ROUNDS 200

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static pthread_cond_t arrived = PTHREAD_COND_INITIALIZER;
static int generation, waiting, seen[THREADS];
static int permits, passed;

static void *body(void *arg)
{
	int id = (int)(uintptr_t)arg;
	pthread_mutex_lock(&lock);
	for (int g = 1; g <= ROUNDS; g++) {
		waiting++;
		pthread_cond_signal(&arrived);
		while (generation < g)
			pthread_cond_wait(&changed, &lock);
		CHECK(generation == g,
		      "thread %d missed generation %d (now %d)", id, g,
		      generation);
		seen[id]++;
	}
	/* Phase 2: one permit per signal. */
	waiting++;
	pthread_cond_signal(&arrived);
	while (permits == 0)
		pthread_cond_wait(&changed, &lock);
	permits--;
	passed++;
	pthread_cond_signal(&arrived);
	pthread_mutex_unlock(&lock);
	return NULL;
}

int main(void)
{
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		PT(pthread_create(&t[i], NULL, body, (void *)(uintptr_t)i));
	pthread_mutex_lock(&lock);
	for (int g = 1; g <= ROUNDS; g++) {
		/* All are waiting for generation g before it is published. */
		while (waiting < THREADS)
			pthread_cond_wait(&arrived, &lock);
		waiting = 0;
		generation = g;
		PT(pthread_cond_broadcast(&changed));
	}
	while (waiting < THREADS)
		pthread_cond_wait(&arrived, &lock);
	for (int k = 1; k <= THREADS; k++) {
		permits++;
		PT(pthread_cond_signal(&changed));
		while (passed < k)
			pthread_cond_wait(&arrived, &lock);
		CHECK(passed == k, "%d threads passed after %d signals",
		      passed, k);
	}
	pthread_mutex_unlock(&lock);
	for (int i = 0; i < THREADS; i++) {
		PT(pthread_join(t[i], NULL));
		CHECK(seen[i] == ROUNDS, "thread %d saw %d generations of %d",
		      i, seen[i], ROUNDS);
	}
	PASS("cond_broadcast");
}
