// A stand-in for an ONNX Runtime library of another version, for the test
// of the version check: OrtGetApiBase reports VERSION as the library's
// version and hands out function tables up to API version MAXAPI only,
// as a real library does (its tables are never called here).
#include <stddef.h>
#include <stdint.h>

static const void *get_api(uint32_t version) { return version <= MAXAPI ? (const void *)&get_api : NULL; }
static const char *get_version(void) { return VERSION; }

static const struct {
	const void *(*GetApi)(uint32_t);
	const char *(*GetVersionString)(void);
} base = {get_api, get_version};

const void *OrtGetApiBase(void) { return &base; }
