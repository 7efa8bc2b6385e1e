/*
 * 12 threads allocate, fill with a per-thread pattern, check and free
 * blocks of many sizes (16 B to 256 KiB, so glibc's tcache, arenas and
 * mmap all take part), keeping up to 64 live at once; blocks are also
 * handed to another thread to free (cross-thread free) and grown with
 * realloc. Every byte is checked before it is freed.
 */
#include "check.h"
#include <pthread.h>

#define THREADS 12
#define OPS 20000
#define LIVE 64

struct block {
	unsigned char *p;
	size_t n;
	unsigned char tag;
};

/* Blocks passed from thread i to thread (i+1) % THREADS to free. */
static struct block handoff[THREADS][LIVE];
static pthread_mutex_t handoff_lock[THREADS];
static int handoff_n[THREADS];
static long freed_foreign[THREADS];

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void fill(struct block *b)
{
	for (size_t i = 0; i < b->n; i++)
		b->p[i] = (unsigned char)(b->tag + i * 31);
}

static void verify(const struct block *b, int id, const char *what)
{
	for (size_t i = 0; i < b->n; i++)
		CHECK(b->p[i] == (unsigned char)(b->tag + i * 31),
		      "thread %d: %s block of %zu bytes at %p: byte %zu is "
		      "%#x, expected %#x", id, what, b->n, (void *)b->p, i,
		      b->p[i], (unsigned char)(b->tag + i * 31));
}

static size_t pick_size(uint64_t *s)
{
	uint64_t r = rng_next(s);
	/* Mostly small blocks; large ones are few, or checking every byte
	 * would take seconds. */
	if (r % 64 == 0)
		return 128 * 1024 + r % (128 * 1024); /* mmapped */
	if (r % 8 == 1)
		return 1024 + r % 8192;
	return 16 + r % 512; /* tcache and fast bins */
}

static void take_handoffs(int id)
{
	pthread_mutex_lock(&handoff_lock[id]);
	for (int k = 0; k < handoff_n[id]; k++) {
		verify(&handoff[id][k], id, "handed-off");
		free(handoff[id][k].p);
		freed_foreign[id]++;
	}
	handoff_n[id] = 0;
	pthread_mutex_unlock(&handoff_lock[id]);
}

static void *body(void *arg)
{
	int id = (int)(uintptr_t)arg;
	int next = (id + 1) % THREADS;
	uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1);
	struct block live[LIVE] = {0};
	for (int op = 0; op < OPS; op++) {
		struct block *b = &live[rng_next(&s) % LIVE];
		if (b->p) {
			verify(b, id, "own");
			uint64_t what = rng_next(&s) % 8;
			if (what == 0) {
				/* Grow with realloc: the old bytes move along. */
				size_t old = b->n;
				unsigned char *q = realloc(b->p, old * 2);
				CHECK(q, "realloc to %zu failed", old * 2);
				b->p = q;
				struct block head = *b;
				verify(&head, id, "realloc'd");
				b->n = old * 2;
				fill(b);
				continue;
			}
			if (what == 1) {
				pthread_mutex_lock(&handoff_lock[next]);
				if (handoff_n[next] < LIVE) {
					handoff[next][handoff_n[next]++] = *b;
					b->p = NULL;
				}
				pthread_mutex_unlock(&handoff_lock[next]);
				if (!b->p)
					continue;
			}
			free(b->p);
			b->p = NULL;
		} else {
			b->n = pick_size(&s);
			b->tag = (unsigned char)(id * 17 + op);
			b->p = (rng_next(&s) % 4) ? malloc(b->n)
						  : calloc(1, b->n);
			CHECK(b->p, "allocating %zu bytes failed", b->n);
			fill(b);
		}
		if (op % 1000 == 0)
			take_handoffs(id);
	}
	for (int k = 0; k < LIVE; k++)
		if (live[k].p) {
			verify(&live[k], id, "own");
			free(live[k].p);
		}
	return NULL;
}

int main(void)
{
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		PT(pthread_mutex_init(&handoff_lock[i], NULL));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_create(&t[i], NULL, body, (void *)(uintptr_t)i));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_join(t[i], NULL));
	long foreign = 0;
	for (int i = 0; i < THREADS; i++) {
		take_handoffs(i);
		foreign += freed_foreign[i];
	}
	CHECK(foreign > 0, "no block was freed by another thread");
	fprintf(stderr, "%ld blocks freed by another thread\n", foreign);
	PASS("malloc_storm");
}
