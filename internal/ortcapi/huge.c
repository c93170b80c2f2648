// The allocator sessions created with Options.HugePages share (registered
// with the environment, see ortc_huge_register).
//
// A fresh 4 KiB page costs a fault when it is first touched, and on a
// virtual machine a fault costs tens of microseconds: ONNX Runtime's own
// arena maps new memory for every session, so a session run only a few
// times (a backward graph) spends much of its first run faulting its
// working set in. This allocator maps every large block on its own, aligned
// to and advised as transparent huge pages (one fault per 2 MiB), and keeps
// freed blocks for the next allocation of about their size while a session
// using it is open; smaller blocks come from malloc.
#include "capi.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

enum {
	huge_page = 2 << 20, // a transparent huge page (x86-64, and arm64 with 4 KiB pages)
	huge_min = 1 << 20,  // the smallest block mapped on its own
	huge_hdr = 64,       // the header before every block: ONNX Runtime's alignment
};

// huge_block is the header of a block: len is the length of its mapping,
// 0 for a block from malloc; next links the cached blocks.
typedef struct huge_block huge_block;
struct huge_block {
	size_t len;
	huge_block *next;
};

static pthread_mutex_t huge_mu = PTHREAD_MUTEX_INITIALIZER;
// Under huge_mu: the cached blocks and their bytes, the bytes mapped and
// in use, their peak since the cache was last emptied (which bounds the
// cache), and the sessions open with the allocator.
static huge_block *huge_cache;
static size_t huge_cached, huge_in_use, huge_peak;
static int huge_users;
static OrtMemoryInfo *huge_info_p;

// huge_take removes and returns the smallest cached block of len bytes or
// up to a quarter more, or NULL.
static huge_block *huge_take(size_t len) {
	huge_block **best = NULL;
	for (huge_block **b = &huge_cache; *b != NULL; b = &(*b)->next) {
		size_t l = (*b)->len;
		if (l >= len && l - len <= len / 4 && (best == NULL || l < (*best)->len)) {
			best = b;
		}
	}
	if (best == NULL) {
		return NULL;
	}
	huge_block *b = *best;
	*best = b->next;
	huge_cached -= b->len;
	return b;
}

// huge_map maps len bytes (a multiple of huge_page) at a huge_page
// boundary, advised as huge pages.
static huge_block *huge_map(size_t len) {
	size_t span = len + huge_page;
	char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		return NULL;
	}
	char *q = (char *)(((uintptr_t)p + huge_page - 1) & ~(uintptr_t)(huge_page - 1));
	if (q > p) {
		munmap(p, (size_t)(q - p));
	}
	if (p + span > q + len) {
		munmap(q + len, (size_t)(p + span - (q + len)));
	}
	ortc_huge_advise(q, len);
	huge_block *b = (huge_block *)q;
	b->len = len;
	return b;
}

void ortc_huge_advise(void *p, size_t n) {
	// Advice only: a kernel without transparent huge pages (or with them
	// off) maps small pages, as for any other memory.
#ifdef MADV_HUGEPAGE
	uintptr_t a = ((uintptr_t)p + huge_page - 1) & ~(uintptr_t)(huge_page - 1);
	uintptr_t e = ((uintptr_t)p + n) & ~(uintptr_t)(huge_page - 1);
	if (e > a) {
		madvise((void *)a, e - a, MADV_HUGEPAGE);
	}
#endif
}

static void *huge_alloc(ortc_allocator *a, size_t size) {
	(void)a;
	if (size > SIZE_MAX / 2) {
		return NULL;
	}
	if (size + huge_hdr < huge_min) {
		void *p = NULL;
		if (posix_memalign(&p, huge_hdr, size + huge_hdr) != 0) {
			return NULL;
		}
		((huge_block *)p)->len = 0;
		return (char *)p + huge_hdr;
	}
	size_t len = (size + huge_hdr + huge_page - 1) & ~(size_t)(huge_page - 1);
	pthread_mutex_lock(&huge_mu);
	huge_block *b = huge_take(len);
	pthread_mutex_unlock(&huge_mu);
	if (b == NULL && (b = huge_map(len)) == NULL) {
		return NULL;
	}
	pthread_mutex_lock(&huge_mu);
	huge_in_use += b->len;
	if (huge_in_use > huge_peak) {
		huge_peak = huge_in_use;
	}
	pthread_mutex_unlock(&huge_mu);
	return (char *)b + huge_hdr;
}

static void huge_free(ortc_allocator *a, void *p) {
	(void)a;
	if (p == NULL) {
		return;
	}
	huge_block *b = (huge_block *)((char *)p - huge_hdr);
	if (b->len == 0) {
		free(b);
		return;
	}
	pthread_mutex_lock(&huge_mu);
	huge_in_use -= b->len;
	if (huge_users > 0 && huge_cached + b->len <= huge_peak) {
		b->next = huge_cache;
		huge_cache = b;
		huge_cached += b->len;
		b = NULL;
	}
	pthread_mutex_unlock(&huge_mu);
	if (b != NULL) {
		munmap(b, b->len);
	}
}

static const OrtMemoryInfo *huge_info(const ortc_allocator *a) {
	(void)a;
	return huge_info_p;
}

static ortc_allocator huge_allocator = {
	.version = ortc_api_version,
	.Alloc = huge_alloc,
	.Free = huge_free,
	.Info = huge_info,
};

OrtStatus *ortc_huge_register(OrtEnv *env) {
	if (huge_info_p == NULL) {
		OrtStatus *st = ORTC_FN(ortc_api_table(), ortc_CreateCpuMemoryInfo)(ortc_device_allocator, ortc_mem_default, &huge_info_p);
		if (st != NULL) {
			return st;
		}
	}
	return ORTC_FN(ortc_api_table(), ortc_RegisterAllocator)(env, &huge_allocator);
}

void ortc_huge_acquire(void) {
	pthread_mutex_lock(&huge_mu);
	huge_users++;
	pthread_mutex_unlock(&huge_mu);
}

void ortc_huge_release(void) {
	huge_block *list = NULL;
	pthread_mutex_lock(&huge_mu);
	if (--huge_users == 0) {
		list = huge_cache;
		huge_cache = NULL;
		huge_cached = 0;
		huge_peak = huge_in_use;
	}
	pthread_mutex_unlock(&huge_mu);
	while (list != NULL) {
		huge_block *next = list->next;
		munmap(list, list->len);
		list = next;
	}
}

void ortc_huge_stats(size_t *in_use, size_t *cached) {
	pthread_mutex_lock(&huge_mu);
	*in_use = huge_in_use;
	*cached = huge_cached;
	pthread_mutex_unlock(&huge_mu);
}
