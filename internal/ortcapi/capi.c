#include "capi.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

// api is the function table, set once by ortc_load; every wrapper below
// reads it.
static const void *api;

const void *ortc_load(const char *path, const char **version, char *err, size_t errlen) {
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		snprintf(err, errlen, "%s", dlerror());
		return NULL;
	}
	const ortc_api_base *(*get_base)(void) = (const ortc_api_base *(*)(void))dlsym(lib, "OrtGetApiBase");
	if (get_base == NULL) {
		snprintf(err, errlen, "no symbol OrtGetApiBase: not an ONNX Runtime library");
		return NULL;
	}
	const ortc_api_base *base = get_base();
	*version = base->GetVersionString();
	api = base->GetApi(ortc_api_version);
	if (api == NULL) {
		snprintf(err, errlen, "ONNX Runtime %s does not provide API version %d (ONNX Runtime 1.%d or newer is needed)",
			*version, ortc_api_version, ortc_api_version);
	}
	return api;
}

int ortc_probe(const char *path, uint32_t api_version, int check, const char **version, char *err, size_t errlen) {
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		snprintf(err, errlen, "%s", dlerror());
		return -1;
	}
	const ortc_api_base *(*get_base)(void) = (const ortc_api_base *(*)(void))dlsym(lib, "OrtGetApiBase");
	if (get_base == NULL) {
		snprintf(err, errlen, "no symbol OrtGetApiBase: not an ONNX Runtime library");
		return -1;
	}
	const ortc_api_base *base = get_base();
	*version = base->GetVersionString();
	// The library stays loaded: it is the one the process goes on to use,
	// or the process stops with the refusal.
	return !check || base->GetApi(api_version) != NULL;
}

const void *ortc_api_table(void) { return api; }

int64_t ortc_empty;

// fail_after counts down to the allocation ortc_fail_allocs asked to fail.
static atomic_int fail_after;

void ortc_fail_allocs(int n) { atomic_store(&fail_after, n); }

void *ortc_calloc(size_t n, size_t size) {
	int k = atomic_load(&fail_after);
	while (k > 0 && !atomic_compare_exchange_weak(&fail_after, &k, k - 1)) {
	}
	if (k == 1) {
		return NULL;
	}
	return calloc(n, size);
}

int ortc_error_code(OrtStatus *st) { return ORTC_FN(api, ortc_GetErrorCode)(st); }
const char *ortc_error_message(OrtStatus *st) { return ORTC_FN(api, ortc_GetErrorMessage)(st); }
void ortc_release_status(OrtStatus *st) { ORTC_RELEASE(api, ortc_ReleaseStatus)(st); }

OrtStatus *ortc_create_env(OrtEnv **out) {
	OrtStatus *st = ORTC_FN(api, ortc_CreateEnv)(ortc_logging_fatal, "fp16audit", out);
	if (st != NULL) {
		return st;
	}
	// Telemetry stays off: fp16audit runs on private models, offline.
	return ORTC_FN(api, ortc_DisableTelemetryEvents)(*out);
}

OrtStatus *ortc_options_new(OrtSessionOptions **out) { return ORTC_FN(api, ortc_CreateSessionOptions)(out); }
void ortc_options_release(OrtSessionOptions *o) { ORTC_RELEASE(api, ortc_ReleaseSessionOptions)(o); }
OrtStatus *ortc_options_threads(OrtSessionOptions *o, int n) { return ORTC_FN(api, ortc_SetIntraOpNumThreads)(o, n); }
OrtStatus *ortc_options_no_mem_pattern(OrtSessionOptions *o) { return ORTC_FN(api, ortc_DisableMemPattern)(o); }
OrtStatus *ortc_options_level(OrtSessionOptions *o, int level) {
	return ORTC_FN(api, ortc_SetSessionGraphOptimizationLevel)(o, level);
}

OrtStatus *ortc_options_config(OrtSessionOptions *o, const char *key, const char *value) {
	return ORTC_FN(api, ortc_AddSessionConfigEntry)(o, key, value);
}
OrtStatus *ortc_options_domain(OrtSessionOptions *o, OrtCustomOpDomain *d) { return ORTC_FN(api, ortc_AddCustomOpDomain)(o, d); }
OrtStatus *ortc_options_initializer(OrtSessionOptions *o, const char *name, const OrtValue *v) {
	return ORTC_FN(api, ortc_AddInitializer)(o, name, v);
}
OrtStatus *ortc_domain_new(const char *name, OrtCustomOpDomain **out) { return ORTC_FN(api, ortc_CreateCustomOpDomain)(name, out); }
OrtStatus *ortc_domain_add(OrtCustomOpDomain *d, const void *op) { return ORTC_FN(api, ortc_CustomOpDomain_Add)(d, op); }
OrtStatus *ortc_prepacked_new(OrtPrepackedWeightsContainer **out) {
	return ORTC_FN(api, ortc_CreatePrepackedWeightsContainer)(out);
}
void ortc_prepacked_release(OrtPrepackedWeightsContainer *c) { ORTC_RELEASE(api, ortc_ReleasePrepackedWeightsContainer)(c); }

OrtStatus *ortc_session_new(OrtEnv *env, const void *data, size_t len, const OrtSessionOptions *o,
	OrtPrepackedWeightsContainer *prepacked, OrtSession **out) {
	if (prepacked != NULL) {
		return ORTC_FN(api, ortc_CreateSessionFromArrayWithPrepackedWeightsContainer)(env, data, len, o, prepacked, out);
	}
	return ORTC_FN(api, ortc_CreateSessionFromArray)(env, data, len, o, out);
}

void ortc_session_release(OrtSession *s) { ORTC_RELEASE(api, ortc_ReleaseSession)(s); }

OrtStatus *ortc_run_options_new(OrtRunOptions **out) { return ORTC_FN(api, ortc_CreateRunOptions)(out); }
void ortc_run_options_release(OrtRunOptions *o) { ORTC_RELEASE(api, ortc_ReleaseRunOptions)(o); }
OrtStatus *ortc_run_options_terminate(OrtRunOptions *o) { return ORTC_FN(api, ortc_RunOptionsSetTerminate)(o); }

OrtStatus *ortc_run(OrtSession *s, const OrtRunOptions *o, const char *const *in_names, const OrtValue *const *in,
	size_t n_in, const char *const *out_names, size_t n_out, OrtValue **out) {
	return ORTC_FN(api, ortc_Run)(s, o, in_names, in, n_in, out_names, n_out, out);
}

OrtStatus *ortc_memory_info_cpu(OrtMemoryInfo **out) {
	return ORTC_FN(api, ortc_CreateCpuMemoryInfo)(ortc_arena_allocator, ortc_mem_default, out);
}

OrtStatus *ortc_tensor_new(const OrtMemoryInfo *mi, void *data, size_t len, const int64_t *shape, size_t rank,
	int elem_type, OrtValue **out) {
	return ORTC_FN(api, ortc_CreateTensorWithDataAsOrtValue)(mi, data, len, shape, rank, elem_type, out);
}

void ortc_value_release(OrtValue *v) { ORTC_RELEASE(api, ortc_ReleaseValue)(v); }
OrtStatus *ortc_tensor_data(OrtValue *v, void **out) { return ORTC_FN(api, ortc_GetTensorMutableData)(v, out); }

OrtStatus *ortc_tensor_info(const OrtValue *v, int *elem_type, size_t *rank, size_t *count, int64_t *dims, size_t maxdims) {
	OrtTensorTypeAndShapeInfo *info = NULL;
	OrtStatus *st = ORTC_FN(api, ortc_GetTensorTypeAndShape)(v, &info);
	if (st != NULL) {
		return st;
	}
	st = ORTC_FN(api, ortc_GetTensorElementType)(info, elem_type);
	if (st == NULL) {
		st = ORTC_FN(api, ortc_GetDimensionsCount)(info, rank);
	}
	if (st == NULL) {
		st = ORTC_FN(api, ortc_GetTensorShapeElementCount)(info, count);
	}
	if (st == NULL && *rank <= maxdims) {
		st = ORTC_FN(api, ortc_GetDimensions)(info, dims, *rank);
	}
	ORTC_RELEASE(api, ortc_ReleaseTensorTypeAndShapeInfo)(info);
	return st;
}
