/*
 * 4 producers and 4 consumers over a bounded ring guarded by one mutex and
 * two condvars (not full / not empty). Every item is produced once and
 * consumed once: the count and the sum of the items are exact, and each
 * consumer's items from one producer arrive in that producer's order.
 */
#include "check.h"
#include <pthread.h>

#define PRODUCERS 4
#define CONSUMERS 4
#define PER_PRODUCER 50000
#define RING 16

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t not_full = PTHREAD_COND_INITIALIZER;
static pthread_cond_t not_empty;
static long ring[RING];
static int head, count, producers_left = PRODUCERS;

struct consumer {
	long items;
	long sum;
	long last_seq[PRODUCERS];
};

static void *produce(void *arg)
{
	long p = (long)(uintptr_t)arg;
	for (long seq = 0; seq < PER_PRODUCER; seq++) {
		long item = p * PER_PRODUCER + seq;
		pthread_mutex_lock(&lock);
		while (count == RING)
			pthread_cond_wait(&not_full, &lock);
		ring[(head + count) % RING] = item;
		count++;
		pthread_cond_signal(&not_empty);
		pthread_mutex_unlock(&lock);
	}
	pthread_mutex_lock(&lock);
	producers_left--;
	/* Consumers waiting on an empty ring must see the end. */
	pthread_cond_broadcast(&not_empty);
	pthread_mutex_unlock(&lock);
	return NULL;
}

static void *consume(void *arg)
{
	struct consumer *c = arg;
	for (int p = 0; p < PRODUCERS; p++)
		c->last_seq[p] = -1;
	for (;;) {
		pthread_mutex_lock(&lock);
		while (count == 0 && producers_left > 0)
			pthread_cond_wait(&not_empty, &lock);
		if (count == 0) {
			pthread_mutex_unlock(&lock);
			return NULL;
		}
		long item = ring[head];
		head = (head + 1) % RING;
		count--;
		pthread_cond_signal(&not_full);
		pthread_mutex_unlock(&lock);

		long p = item / PER_PRODUCER, seq = item % PER_PRODUCER;
		CHECK(p >= 0 && p < PRODUCERS, "item %ld from no producer", item);
		CHECK(seq > c->last_seq[p],
		      "producer %ld's item %ld after its item %ld", p, seq,
		      c->last_seq[p]);
		c->last_seq[p] = seq;
		c->items++;
		c->sum += item;
	}
}

int main(void)
{
	pthread_t pt[PRODUCERS], ct[CONSUMERS];
	struct consumer cs[CONSUMERS] = {0};
	PT(pthread_cond_init(&not_empty, NULL));
	for (int i = 0; i < CONSUMERS; i++)
		PT(pthread_create(&ct[i], NULL, consume, &cs[i]));
	for (long i = 0; i < PRODUCERS; i++)
		PT(pthread_create(&pt[i], NULL, produce, (void *)(uintptr_t)i));
	for (int i = 0; i < PRODUCERS; i++)
		PT(pthread_join(pt[i], NULL));
	long items = 0, sum = 0;
	for (int i = 0; i < CONSUMERS; i++) {
		PT(pthread_join(ct[i], NULL));
		items += cs[i].items;
		sum += cs[i].sum;
	}
	long n = (long)PRODUCERS * PER_PRODUCER;
	CHECK(items == n, "%ld items consumed, expected %ld", items, n);
	CHECK(sum == n * (n - 1) / 2, "items sum to %ld, expected %ld", sum,
	      n * (n - 1) / 2);
	CHECK(count == 0, "%d items left in the ring", count);
	PT(pthread_cond_destroy(&not_empty));
	PASS("cond_prodcons");
}
