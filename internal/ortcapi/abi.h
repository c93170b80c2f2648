// The part of ONNX Runtime's C ABI that fp16audit uses, declared here from
// the ABI facts (exported entry point, positions in the function table,
// struct layouts, enum values) rather than by including Microsoft's header:
// the library is loaded at run time, so only these facts have to agree.
// abi_test.go checks every position and layout below against the header
// that github.com/yalue/onnxruntime_go ships in the Go module cache.
//
// The function table (OrtApi) only ever grows at its end, so a position
// that is right for the API version requested stays right in every later
// library. ORT_API_CALL is empty on every 64-bit platform, so these are
// plain C function pointers.
#ifndef FP16AUDIT_ORTCAPI_ABI_H
#define FP16AUDIT_ORTCAPI_ABI_H

#include <stddef.h>
#include <stdint.h>

// ortc_api_version is the OrtApi version requested: 17 (ONNX Runtime 1.17)
// is the first with KernelContext_ParallelFor, the newest function used.
enum { ortc_api_version = 17 };

// ortc_custom_op_version is the OrtCustomOp version the statistics ops
// declare: 16 is the first whose CreateKernelV2/KernelComputeV2 (errors as
// statuses) ONNX Runtime reads; it reads no field after KernelComputeV2
// below version 17.
enum { ortc_custom_op_version = 16 };

typedef struct OrtStatus OrtStatus;
typedef struct OrtEnv OrtEnv;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtSession OrtSession;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtValue OrtValue;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtPrepackedWeightsContainer OrtPrepackedWeightsContainer;

// The two entries of the struct OrtGetApiBase returns.
typedef struct {
	const void *(*GetApi)(uint32_t version);
	const char *(*GetVersionString)(void);
} ortc_api_base;

// Positions in the OrtApi function table.
enum {
	ortc_CreateStatus = 0,
	ortc_GetErrorCode = 1,
	ortc_GetErrorMessage = 2,
	ortc_CreateEnv = 3,
	ortc_DisableTelemetryEvents = 6,
	ortc_CreateSessionFromArray = 8,
	ortc_Run = 9,
	ortc_CreateSessionOptions = 10,
	ortc_DisableMemPattern = 17,
	ortc_SetSessionGraphOptimizationLevel = 23,
	ortc_SetIntraOpNumThreads = 24,
	ortc_CreateCustomOpDomain = 26,
	ortc_CustomOpDomain_Add = 27,
	ortc_AddCustomOpDomain = 28,
	ortc_CreateRunOptions = 39,
	ortc_RunOptionsSetTerminate = 46,
	ortc_CreateTensorWithDataAsOrtValue = 49,
	ortc_GetTensorMutableData = 51,
	ortc_GetTensorElementType = 60,
	ortc_GetDimensionsCount = 61,
	ortc_GetDimensions = 62,
	ortc_GetTensorShapeElementCount = 64,
	ortc_GetTensorTypeAndShape = 65,
	ortc_CreateCpuMemoryInfo = 69,
	ortc_KernelInfoGetAttribute_int64 = 86,
	ortc_KernelContext_GetInputCount = 88,
	ortc_KernelContext_GetInput = 90,
	ortc_KernelContext_GetOutput = 91,
	ortc_ReleaseEnv = 92,
	ortc_ReleaseStatus = 93,
	ortc_ReleaseMemoryInfo = 94,
	ortc_ReleaseSession = 95,
	ortc_ReleaseValue = 96,
	ortc_ReleaseRunOptions = 97,
	ortc_ReleaseTensorTypeAndShapeInfo = 99,
	ortc_ReleaseSessionOptions = 100,
	ortc_ReleaseCustomOpDomain = 101,
	ortc_AddSessionConfigEntry = 130,
	ortc_AddInitializer = 150,
	ortc_CreatePrepackedWeightsContainer = 166,
	ortc_ReleasePrepackedWeightsContainer = 167,
	ortc_CreateSessionFromArrayWithPrepackedWeightsContainer = 169,
	ortc_KernelContext_ParallelFor = 274,
};

// Enum values (C enums are int-sized on every supported platform).
enum {
	ortc_logging_fatal = 4,      // OrtLoggingLevel: verbose 0 ... fatal 4
	ortc_err_fail = 1,           // OrtErrorCode ORT_FAIL
	ortc_err_invalid_argument = 2, // OrtErrorCode ORT_INVALID_ARGUMENT
	ortc_arena_allocator = 1,    // OrtAllocatorType OrtArenaAllocator
	ortc_mem_default = 0,        // OrtMemType OrtMemTypeDefault
	ortc_io_required = 0,        // OrtCustomOpInputOutputCharacteristic INPUT_OUTPUT_REQUIRED
	ortc_io_optional = 1,        // OrtCustomOpInputOutputCharacteristic INPUT_OUTPUT_OPTIONAL
	ortc_io_variadic = 2,        // OrtCustomOpInputOutputCharacteristic INPUT_OUTPUT_VARIADIC
};

// Element types are ONNX's TensorProto.DataType numbers.
enum {
	ortc_float = 1,
	ortc_int64 = 7,
	ortc_double = 11,
};

// Function pointer types of the entries called.
typedef OrtStatus *(*ortc_CreateStatus_fn)(int code, const char *msg);
typedef int (*ortc_GetErrorCode_fn)(const OrtStatus *);
typedef const char *(*ortc_GetErrorMessage_fn)(const OrtStatus *);
typedef void (*ortc_Release_fn)(void *);
typedef OrtStatus *(*ortc_CreateEnv_fn)(int level, const char *logid, OrtEnv **out);
typedef OrtStatus *(*ortc_DisableTelemetryEvents_fn)(const OrtEnv *);
typedef OrtStatus *(*ortc_CreateSessionFromArray_fn)(const OrtEnv *, const void *data, size_t len, const OrtSessionOptions *, OrtSession **out);
typedef OrtStatus *(*ortc_CreateSessionFromArrayWithPrepackedWeightsContainer_fn)(const OrtEnv *, const void *data, size_t len,
	const OrtSessionOptions *, OrtPrepackedWeightsContainer *, OrtSession **out);
typedef OrtStatus *(*ortc_Run_fn)(OrtSession *, const OrtRunOptions *run_options, const char *const *in_names, const OrtValue *const *in,
	size_t n_in, const char *const *out_names, size_t n_out, OrtValue **out);
typedef OrtStatus *(*ortc_CreateSessionOptions_fn)(OrtSessionOptions **out);
typedef OrtStatus *(*ortc_CreateRunOptions_fn)(OrtRunOptions **out);
typedef OrtStatus *(*ortc_RunOptionsSetTerminate_fn)(OrtRunOptions *);
typedef OrtStatus *(*ortc_SetSessionGraphOptimizationLevel_fn)(OrtSessionOptions *, int level);
typedef OrtStatus *(*ortc_SetIntraOpNumThreads_fn)(OrtSessionOptions *, int threads);
typedef OrtStatus *(*ortc_DisableMemPattern_fn)(OrtSessionOptions *);
typedef OrtStatus *(*ortc_AddSessionConfigEntry_fn)(OrtSessionOptions *, const char *key, const char *value);
typedef OrtStatus *(*ortc_AddInitializer_fn)(OrtSessionOptions *, const char *name, const OrtValue *);
typedef OrtStatus *(*ortc_CreateCustomOpDomain_fn)(const char *domain, OrtCustomOpDomain **out);
typedef OrtStatus *(*ortc_CustomOpDomain_Add_fn)(OrtCustomOpDomain *, const void *op);
typedef OrtStatus *(*ortc_AddCustomOpDomain_fn)(OrtSessionOptions *, OrtCustomOpDomain *);
typedef OrtStatus *(*ortc_CreateCpuMemoryInfo_fn)(int allocator_type, int mem_type, OrtMemoryInfo **out);
typedef OrtStatus *(*ortc_CreateTensorWithDataAsOrtValue_fn)(const OrtMemoryInfo *, void *data, size_t len, const int64_t *shape,
	size_t rank, int elem_type, OrtValue **out);
typedef OrtStatus *(*ortc_GetTensorMutableData_fn)(OrtValue *, void **out);
typedef OrtStatus *(*ortc_GetTensorTypeAndShape_fn)(const OrtValue *, OrtTensorTypeAndShapeInfo **out);
typedef OrtStatus *(*ortc_GetTensorElementType_fn)(const OrtTensorTypeAndShapeInfo *, int *out);
typedef OrtStatus *(*ortc_GetDimensionsCount_fn)(const OrtTensorTypeAndShapeInfo *, size_t *out);
typedef OrtStatus *(*ortc_GetTensorShapeElementCount_fn)(const OrtTensorTypeAndShapeInfo *, size_t *out);
typedef OrtStatus *(*ortc_GetDimensions_fn)(const OrtTensorTypeAndShapeInfo *, int64_t *dims, size_t n);
typedef OrtStatus *(*ortc_KernelInfoGetAttribute_int64_fn)(const OrtKernelInfo *, const char *name, int64_t *out);
typedef OrtStatus *(*ortc_KernelContext_GetInputCount_fn)(const OrtKernelContext *, size_t *out);
typedef OrtStatus *(*ortc_KernelContext_GetInput_fn)(const OrtKernelContext *, size_t index, const OrtValue **out);
typedef OrtStatus *(*ortc_KernelContext_GetOutput_fn)(OrtKernelContext *, size_t index, const int64_t *dims, size_t rank, OrtValue **out);
typedef OrtStatus *(*ortc_KernelContext_ParallelFor_fn)(const OrtKernelContext *, void (*fn)(void *, size_t), size_t total,
	size_t num_batch, void *user);
typedef OrtStatus *(*ortc_CreatePrepackedWeightsContainer_fn)(OrtPrepackedWeightsContainer **out);

// ORTC_FN fetches entry `name` of the function table `api` as its type.
#define ORTC_FN(api, name) ((name##_fn)(((void *const *)(api))[name]))
#define ORTC_RELEASE(api, name) ((ortc_Release_fn)(((void *const *)(api))[name]))

// ortc_custom_op is OrtCustomOp up to the last field version 16 defines:
// a uint32 version, then function pointers only.
typedef struct ortc_custom_op ortc_custom_op;
struct ortc_custom_op {
	uint32_t version;
	void *(*CreateKernel)(const ortc_custom_op *, const void *api, const OrtKernelInfo *);
	const char *(*GetName)(const ortc_custom_op *);
	const char *(*GetExecutionProviderType)(const ortc_custom_op *);
	int (*GetInputType)(const ortc_custom_op *, size_t index);
	size_t (*GetInputTypeCount)(const ortc_custom_op *);
	int (*GetOutputType)(const ortc_custom_op *, size_t index);
	size_t (*GetOutputTypeCount)(const ortc_custom_op *);
	void (*KernelCompute)(void *kernel, OrtKernelContext *);
	void (*KernelDestroy)(void *kernel);
	int (*GetInputCharacteristic)(const ortc_custom_op *, size_t index);
	int (*GetOutputCharacteristic)(const ortc_custom_op *, size_t index);
	int (*GetInputMemoryType)(const ortc_custom_op *, size_t index);
	int (*GetVariadicInputMinArity)(const ortc_custom_op *);
	int (*GetVariadicInputHomogeneity)(const ortc_custom_op *);
	int (*GetVariadicOutputMinArity)(const ortc_custom_op *);
	int (*GetVariadicOutputHomogeneity)(const ortc_custom_op *);
	OrtStatus *(*CreateKernelV2)(const ortc_custom_op *, const void *api, const OrtKernelInfo *, void **kernel);
	OrtStatus *(*KernelComputeV2)(void *kernel, OrtKernelContext *);
};

#endif
