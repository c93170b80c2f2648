package onnx

import (
	"slices"
	"testing"
)

func withMeta(name string, kv ...string) *NodeProto {
	nd := &NodeProto{Name: name, OpType: "Conv"}
	for i := 0; i+1 < len(kv); i += 2 {
		nd.MetadataProps = append(nd.MetadataProps, &StringStringEntryProto{Key: kv[i], Value: kv[i+1]})
	}
	return nd
}

func TestModulePath(t *testing.T) {
	tests := []struct {
		name string
		node *NodeProto
		path string
	}{
		{"torchscript resnet", withMeta("/layer1/layer1.0/conv1/Conv"), "layer1.0.conv1"},
		{"torchscript nested sequential", withMeta("/layer2/layer2.0/downsample/downsample.0/Conv"), "layer2.0.downsample.0"},
		{"torchscript transformer", withMeta("/encoder/layers.0/self_attn/MatMul_1"), "encoder.layers.0.self_attn"},
		{"torchscript sequential child", withMeta("/features/features.3/Relu"), "features.3"},
		{"torchscript root", withMeta("/Flatten"), ""},
		{"no scope in name", withMeta("Conv_12"), ""},
		{"no name", &NodeProto{OpType: "Gemm"}, ""},
		{"dynamo with node name and classes", withMeta("node_Conv_3",
			nameScopesKey, "['', 'layer1', 'layer1.0', 'layer1.0.conv1', 'convolution']",
			classHierarchyKey, "['torchvision.models.resnet.ResNet', 'torch.nn.modules.container.Sequential', 'torchvision.models.resnet.BasicBlock', 'torch.nn.modules.conv.Conv2d', 'aten.convolution.default']"),
			"layer1.0.conv1"},
		{"dynamo root op with classes", withMeta("node_view",
			nameScopesKey, "['', 'view']",
			classHierarchyKey, "['Net', 'aten.view.default']"),
			""},
		{"dynamo node name without classes", withMeta("",
			nameScopesKey, "['', 'fc', 'addmm']"),
			"fc"},
		{"module list only", withMeta("",
			nameScopesKey, "['', 'layer1', 'layer1.0', 'layer1.0.conv1']"),
			"layer1.0.conv1"},
		{"json-style quotes", withMeta("",
			nameScopesKey, `["", "blocks", "blocks.2", "blocks.2.mlp"]`),
			"blocks.2.mlp"},
		{"metadata wins over name", withMeta("/other/Conv",
			nameScopesKey, "['', 'head']"),
			"head"},
		{"empty scopes", withMeta("",
			nameScopesKey, "['']"),
			""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ModulePath(tt.node); got != tt.path {
				t.Errorf("ModulePath = %q; want %q", got, tt.path)
			}
		})
	}
}

func TestParseList(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"['', 'a', 'a.b']", []string{"", "a", "a.b"}},
		{`["x", "it's"]`, []string{"x", "it's"}},
		{`['it\'s']`, []string{"it's"}},
		{"[a, b]", []string{"a", "b"}},
		{"[]", nil},
	}
	for _, tt := range tests {
		if got := parseList(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("parseList(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

// TestModulePathFusedConv: a Conv into which torch 2.9's dynamo exporter
// folded the BatchNorm after it carries the BatchNorm's module stack; its
// module is the convolution's, which its weight is still named after.
func TestModulePathFusedConv(t *testing.T) {
	n := &NodeProto{Name: "node_Conv_181", OpType: "Conv", Input: []string{"pixels", "layer1.0.conv1.weight"}, MetadataProps: []*StringStringEntryProto{
		{Key: nameScopesKey, Value: "['', 'layer1', 'layer1.0', 'layer1.0.bn1', '_native_batch_norm_legit_no_training_1']"},
		{Key: classHierarchyKey, Value: "['models.TinyResNet', 'torch.nn.modules.container.Sequential', 'torchvision.models.resnet.BasicBlock', 'torch.nn.modules.batchnorm.BatchNorm2d', 'aten._native_batch_norm_legit_no_training.default']"},
	}}
	if got := ModulePath(n); got != "layer1.0.conv1" {
		t.Errorf("fused Conv: module %q, want layer1.0.conv1", got)
	}
	n.OpType = "Relu"
	if got := ModulePath(n); got != "layer1.0.bn1" {
		t.Errorf("not a Conv: module %q, want the metadata's layer1.0.bn1", got)
	}
}

// TestSourceAsksDtype: the line of Python a node comes from tells a fill
// that asks the dtype from one that does not say.
func TestSourceAsksDtype(t *testing.T) {
	trace := func(line string) *NodeProto {
		return &NodeProto{MetadataProps: []*StringStringEntryProto{{Key: stackTraceKey,
			Value: "File \"m.py\", line 9, in forward\n    " + line + "\n"}}}
	}
	for line, want := range map[string]bool{
		"scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)": true,
		"x.masked_fill(m, finfo( h[0].dtype ).min)":                        true,
		"scores.masked_fill(mask, torch.finfo(torch.float32).min)":         false,
		"scores.masked_fill(mask, min_dtype)":                              false,
		"scores.masked_fill(mask, -1e9)":                                   false,
	} {
		if got := SourceAsksDtype(trace(line)); got != want {
			t.Errorf("%q: %v, want %v", line, got, want)
		}
	}
	if SourceAsksDtype(&NodeProto{}) {
		t.Error("a node without a stack trace asks the dtype")
	}
}
