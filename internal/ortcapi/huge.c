// The allocator sessions created with Options.HugePages share (registered
// with the environment, see ortc_huge_register).
//
// A fresh 4 KiB page costs a fault when it is first touched, and on a
// virtual machine a fault costs tens of microseconds: ONNX Runtime's own
// arena maps new memory for every session, so a session run only a few
// times (a backward graph) spends much of its first run faulting its
// working set in. This allocator takes its memory in transparent huge
// pages (one fault per 2 MiB):
//
//   - a block over 15 × 64 KiB (960 KiB) is a mapping of its own, aligned to and
//     advised as huge pages; freed, it is kept for the next allocation of
//     about its size (up to the peak mapped in use);
//   - a block from 64 KiB up is one of a size class (multiples of 64 KiB)
//     carved from a 2 MiB huge page (a slab); freed, it goes back to its
//     class;
//   - smaller blocks come from malloc.
//
// While a session using the allocator is open, nothing is unmapped; when
// the last one goes, the kept mappings and the slabs without a block in use
// are unmapped (a slab still in use, for an output a caller holds, when its
// last block is freed).
#include "capi.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

enum {
	huge_page = 2 << 20, // a transparent huge page (x86-64, and arm64 with 4 KiB pages)
	slab_unit = 64 << 10, // the slab size classes' step, and the smallest
	slab_classes = 15, // classes of 1..15 units; a larger block is mapped on its own
	huge_hdr = 64, // the header before every block: ONNX Runtime's alignment
};

enum { kind_malloc, kind_mapped, kind_slab };

typedef struct huge_slab huge_slab;

// huge_block is the header of a block: its kind, the length of its mapping
// (kind_mapped) or its slab (kind_slab), and the next kept block.
typedef struct huge_block huge_block;
struct huge_block {
	int kind;
	size_t len;
	huge_slab *slab;
	huge_block *next;
};

// huge_slab is a huge page carved into blocks of cls units, used of them
// in use.
struct huge_slab {
	char *base;
	int cls, used;
};

static pthread_mutex_t huge_mu = PTHREAD_MUTEX_INITIALIZER;
// Under huge_mu: the kept mappings and their bytes, the bytes mapped on
// their own and in use and their peak since the cache was last emptied
// (which bounds the cache), the free blocks of each slab class, and the
// sessions open with the allocator.
static huge_block *huge_cache;
static size_t huge_cached, huge_in_use, huge_peak;
static huge_block *slab_free[slab_classes + 1];
static size_t slabs_mapped;
static int huge_users;
static OrtMemoryInfo *huge_info_p;

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

// huge_map maps len bytes (a multiple of huge_page) at a huge_page
// boundary, advised as huge pages, or returns NULL.
static char *huge_map(size_t len) {
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
	return q;
}

// huge_take removes and returns the smallest kept mapping of len bytes or
// up to a quarter more, or NULL. Under huge_mu.
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

static void *alloc_mapped(size_t size) {
	size_t len = (size + huge_hdr + huge_page - 1) & ~(size_t)(huge_page - 1);
	pthread_mutex_lock(&huge_mu);
	huge_block *b = huge_take(len);
	pthread_mutex_unlock(&huge_mu);
	if (b == NULL) {
		char *q = huge_map(len);
		if (q == NULL) {
			return NULL;
		}
		b = (huge_block *)q;
		b->kind = kind_mapped;
		b->len = len;
	}
	pthread_mutex_lock(&huge_mu);
	huge_in_use += b->len;
	if (huge_in_use > huge_peak) {
		huge_peak = huge_in_use;
	}
	pthread_mutex_unlock(&huge_mu);
	return (char *)b + huge_hdr;
}

// slab_new carves a new huge page into blocks of cls units and puts all
// but the first on the class's free list; it returns the first, or NULL.
// Under huge_mu.
static huge_block *slab_new(int cls) {
	huge_slab *s = malloc(sizeof *s);
	if (s == NULL) {
		return NULL;
	}
	if ((s->base = huge_map(huge_page)) == NULL) {
		free(s);
		return NULL;
	}
	s->cls = cls;
	s->used = 0;
	slabs_mapped++;
	size_t size = (size_t)cls * slab_unit;
	huge_block *first = NULL;
	for (size_t off = 0; off + size <= huge_page; off += size) {
		huge_block *b = (huge_block *)(s->base + off);
		b->kind = kind_slab;
		b->slab = s;
		if (first == NULL) {
			first = b;
		} else {
			b->next = slab_free[cls];
			slab_free[cls] = b;
		}
	}
	return first;
}

static void *alloc_slab(size_t size) {
	int cls = (int)((size + huge_hdr + slab_unit - 1) / slab_unit);
	pthread_mutex_lock(&huge_mu);
	huge_block *b = slab_free[cls];
	if (b != NULL) {
		slab_free[cls] = b->next;
	} else {
		b = slab_new(cls);
	}
	if (b != NULL) {
		b->slab->used++;
	}
	pthread_mutex_unlock(&huge_mu);
	return b == NULL ? NULL : (char *)b + huge_hdr;
}

static void *huge_alloc(ortc_allocator *a, size_t size) {
	(void)a;
	if (size > SIZE_MAX / 2) {
		return NULL;
	}
	if (size + huge_hdr > (size_t)slab_classes * slab_unit) {
		return alloc_mapped(size);
	}
	if (size + huge_hdr > slab_unit) {
		return alloc_slab(size);
	}
	void *p = NULL;
	if (posix_memalign(&p, huge_hdr, size + huge_hdr) != 0) {
		return NULL;
	}
	((huge_block *)p)->kind = kind_malloc;
	return (char *)p + huge_hdr;
}

// slab_unmap unmaps a slab none of whose blocks is in use or kept.
static void slab_unmap(huge_slab *s) {
	munmap(s->base, huge_page);
	free(s);
	pthread_mutex_lock(&huge_mu);
	slabs_mapped--;
	pthread_mutex_unlock(&huge_mu);
}

static void huge_free(ortc_allocator *a, void *p) {
	(void)a;
	if (p == NULL) {
		return;
	}
	huge_block *b = (huge_block *)((char *)p - huge_hdr);
	huge_slab *gone = NULL;
	switch (b->kind) {
	case kind_malloc:
		free(b);
		return;
	case kind_slab:
		pthread_mutex_lock(&huge_mu);
		b->slab->used--;
		if (huge_users > 0) {
			b->next = slab_free[b->slab->cls];
			slab_free[b->slab->cls] = b;
		} else if (b->slab->used == 0) {
			gone = b->slab; // its other blocks were dropped from the lists
		}
		pthread_mutex_unlock(&huge_mu);
		if (gone != NULL) {
			slab_unmap(gone);
		}
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
	huge_block *slabs = NULL; // the first block of each slab to unmap
	pthread_mutex_lock(&huge_mu);
	if (--huge_users == 0) {
		list = huge_cache;
		huge_cache = NULL;
		huge_cached = 0;
		huge_peak = huge_in_use;
		// Every free block leaves its list; a slab with none in use goes
		// (once: its first free block met stands for it).
		for (int c = 1; c <= slab_classes; c++) {
			for (huge_block *b = slab_free[c], *next; b != NULL; b = next) {
				next = b->next;
				if (b->slab->used == 0) {
					b->slab->used = -1;
					b->next = slabs;
					slabs = b;
				}
			}
			slab_free[c] = NULL;
		}
	}
	pthread_mutex_unlock(&huge_mu);
	while (list != NULL) {
		huge_block *next = list->next;
		munmap(list, list->len);
		list = next;
	}
	while (slabs != NULL) {
		huge_block *next = slabs->next;
		slab_unmap(slabs->slab);
		slabs = next;
	}
}

void ortc_huge_stats(size_t *in_use, size_t *cached, size_t *slabs, size_t *slab_free_blocks) {
	pthread_mutex_lock(&huge_mu);
	*in_use = huge_in_use;
	*cached = huge_cached;
	*slabs = slabs_mapped;
	size_t n = 0;
	for (int c = 1; c <= slab_classes; c++) {
		for (huge_block *b = slab_free[c]; b != NULL; b = b->next) {
			n++;
		}
	}
	*slab_free_blocks = n;
	pthread_mutex_unlock(&huge_mu);
}
