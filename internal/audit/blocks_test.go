package audit

import (
	"testing"
)

// TestBlockOf: module paths to blocks, for the layouts exporters write.
func TestBlockOf(t *testing.T) {
	for _, c := range []struct {
		name    string
		modules []string
		want    map[string]string // module → block; a "*" suffix marks a repeated one
	}{
		{"llama", []string{"", "model", "model.embed_tokens", "model.layers.0.self_attn.q_proj", "model.layers.0", "model.layers.1.mlp.down_proj", "model.norm", "lm_head"},
			map[string]string{"": "", "model": "model", "model.embed_tokens": "model.embed_tokens", "model.layers.0.self_attn.q_proj": "model.layers.0*",
				"model.layers.0": "model.layers.0*", "model.layers.1.mlp.down_proj": "model.layers.1*", "model.norm": "model.norm", "lm_head": "lm_head"}},
		{"bert", []string{"bert.embeddings.word_embeddings", "bert.encoder.layer.0.attention.self.query", "bert.encoder.layer.11.output.dense", "bert.pooler.dense", "classifier"},
			map[string]string{"bert.embeddings.word_embeddings": "bert.embeddings.word_embeddings", "bert.encoder.layer.0.attention.self.query": "bert.encoder.layer.0*",
				"bert.encoder.layer.11.output.dense": "bert.encoder.layer.11*", "bert.pooler.dense": "bert.pooler.dense", "classifier": "classifier"}},
		// T5's blocks hold numbered layers themselves: the outer container
		// decides.
		{"t5", []string{"shared", "block.0.layer.0.SelfAttention.q", "block.0.layer.1.DenseReluDense.wo", "block.2.layer.1.DenseReluDense.wo", "final_layer_norm"},
			map[string]string{"shared": "shared", "block.0.layer.0.SelfAttention.q": "block.0*", "block.2.layer.1.DenseReluDense.wo": "block.2*", "final_layer_norm": "final_layer_norm"}},
		{"resnet", []string{"conv1", "layer1.0.conv1", "layer1.1.conv2", "layer2.0.downsample.0", "layer2.1.conv1", "fc"},
			map[string]string{"conv1": "conv1", "layer1.0.conv1": "layer1.0*", "layer1.1.conv2": "layer1.1*", "layer2.0.downsample.0": "layer2.0*", "fc": "fc"}},
		// One numbered child is no repetition: the top-level modules.
		{"no repetition", []string{"features.0", "head.fc"}, map[string]string{"features.0": "features", "head.fc": "head"}},
	} {
		bo := newBlockOf(c.modules)
		for m, want := range c.want {
			got, rep := bo.of(m)
			if rep {
				got += "*"
			}
			if got != want {
				t.Errorf("%s: %q is in block %q, want %q", c.name, m, got, want)
			}
		}
	}
}
