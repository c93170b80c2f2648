module fp16audit

go 1.26

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/spf13/pflag v1.1.0
	github.com/yalue/onnxruntime_go v1.27.0
	google.golang.org/protobuf v1.36.12
)
