// C side of package ortcapi: loading the library and one thin wrapper per
// ONNX Runtime entry used, so that Go never calls through a function
// pointer itself (cgo cannot).
#ifndef FP16AUDIT_ORTCAPI_CAPI_H
#define FP16AUDIT_ORTCAPI_CAPI_H

#include "abi.h"

// ortc_load opens the library at path, finds OrtGetApiBase and fetches the
// function table of ortc_api_version. It returns the table, or NULL with a
// message in err. version receives the library's version string.
const void *ortc_load(const char *path, const char **version, char *err, size_t errlen);

// ortc_probe opens the library at path and reads its version string into
// version. When check is set it also asks for the function table of
// api_version and returns 1 when the library provides it, 0 when not;
// without check it returns 1. It returns -1, with a message in err, for a
// file that is no ONNX Runtime library.
int ortc_probe(const char *path, uint32_t api_version, int check, const char **version, char *err, size_t errlen);

// ortc_api_table returns the table ortc_load fetched.
const void *ortc_api_table(void);

// ortc_empty is the memory handed to ONNX Runtime for tensors without
// elements.
extern int64_t ortc_empty;

// ortc_calloc is calloc, except that it fails (NULL) when a test asked for
// it with ortc_fail_allocs: a positive n makes the n-th allocation from now
// fail, 0 none.
void *ortc_calloc(size_t n, size_t size);
void ortc_fail_allocs(int n);

// ortc_error_code and ortc_error_message read a non-NULL status;
// ortc_release_status frees it.
int ortc_error_code(OrtStatus *st);
const char *ortc_error_message(OrtStatus *st);
void ortc_release_status(OrtStatus *st);

OrtStatus *ortc_create_env(OrtEnv **out);
OrtStatus *ortc_options_new(OrtSessionOptions **out);
void ortc_options_release(OrtSessionOptions *o);
OrtStatus *ortc_options_threads(OrtSessionOptions *o, int n);
OrtStatus *ortc_options_no_mem_pattern(OrtSessionOptions *o);
OrtStatus *ortc_options_level(OrtSessionOptions *o, int level);
OrtStatus *ortc_options_config(OrtSessionOptions *o, const char *key, const char *value);
OrtStatus *ortc_options_domain(OrtSessionOptions *o, OrtCustomOpDomain *d);
OrtStatus *ortc_options_initializer(OrtSessionOptions *o, const char *name, const OrtValue *v);
OrtStatus *ortc_domain_new(const char *name, OrtCustomOpDomain **out);
OrtStatus *ortc_domain_add(OrtCustomOpDomain *d, const void *op);
OrtStatus *ortc_prepacked_new(OrtPrepackedWeightsContainer **out);
void ortc_prepacked_release(OrtPrepackedWeightsContainer *c);
OrtStatus *ortc_session_new(OrtEnv *env, const void *data, size_t len, const OrtSessionOptions *o,
	OrtPrepackedWeightsContainer *prepacked, OrtSession **out);
void ortc_session_release(OrtSession *s);
OrtStatus *ortc_run_options_new(OrtRunOptions **out);
void ortc_run_options_release(OrtRunOptions *o);

// ortc_run_options_terminate makes the runs with o in flight stop at their
// next node and every later run with o fail at once; ONNX Runtime allows it
// from any thread.
OrtStatus *ortc_run_options_terminate(OrtRunOptions *o);
OrtStatus *ortc_run(OrtSession *s, const OrtRunOptions *o, const char *const *in_names, const OrtValue *const *in,
	size_t n_in, const char *const *out_names, size_t n_out, OrtValue **out);
OrtStatus *ortc_memory_info_cpu(OrtMemoryInfo **out);
OrtStatus *ortc_tensor_new(const OrtMemoryInfo *mi, void *data, size_t len, const int64_t *shape, size_t rank,
	int elem_type, OrtValue **out);
void ortc_value_release(OrtValue *v);
OrtStatus *ortc_tensor_data(OrtValue *v, void **out);

// ortc_tensor_info reads a tensor's element type, rank, element count and
// its first maxdims dimensions in one call.
OrtStatus *ortc_tensor_info(const OrtValue *v, int *elem_type, size_t *rank, size_t *count, int64_t *dims, size_t maxdims);

#endif
