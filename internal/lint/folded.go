package lint

import (
	"fmt"
	"strings"

	"fp16audit/checks"
	"fp16audit/internal/onnx"
)

var checkFoldedBN = checks.Register(&checks.Check{ID: "FP4009", Title: "batchnorm folded into the convolution", Severity: checks.SevWarning,
	Policies: []string{"autocast-fp16", "half"}, Doc: `The exporter folded the BatchNorm after a convolution (or a Linear) into
the layer: the graph computes conv(x)·γ/σ + β' in one node, so the
convolution's own output is not in it. Under autocast (and model.half())
that output is an fp16 tensor before BatchNorm scales it, and with trained
statistics it can pass 65504 where the folded value is small (a stem
convolution reaching 1e5 that BatchNorm brings back to ~1): PyTorch's
output is Inf while the audit of the folded graph sees nothing, and an
overflow after the fold is named at the BatchNorm's module rather than the
convolution's, so keeping "that module" in fp32 keeps the wrong one.

Told from the dynamo exporter's metadata (torch.onnx.export(...,
dynamo=True), the default from torch 2.9, whose optimizer folds: the Conv
or Gemm node carries the BatchNorm's module scope and class) or from the
TorchScript exporter's names (it folds in eval mode whatever
do_constant_folding says and names the computed weight and bias
onnx::Conv_<n>). Where an export carries neither sign, no metadata and
its convolutions' weights under their own names with no BatchNormalization
node left, whether a BatchNorm was folded cannot be told from the graph:
the check says so once, as information.

Export without the fold: torch.onnx.export(model, args, path,
dynamo=True, optimize=False) keeps each BatchNorm as its own node
(measured with torch 2.15). With the TorchScript exporter,
training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False keeps
them too, in training mode: audit that file with fp16audit run --mode
eval, which puts them back on their running statistics.`})

// FoldedBatchNormAnalyzer reports the layers an exporter folded a
// BatchNorm into, or says once that an export cannot tell.
var FoldedBatchNormAnalyzer = &Analyzer{Check: checkFoldedBN, Run: runFoldedBN}

// recipes to export without the fold, by exporter.
const (
	dynamoUnfolded      = "export without the fold: torch.onnx.export(model, args, path, dynamo=True, optimize=False)"
	torchScriptUnfolded = "export without the fold: torch.onnx.export(model, args, path, dynamo=True, optimize=False), or with this exporter training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False and audit with fp16audit run --mode eval"
	foldHides           = "under autocast the layer's own output is an fp16 tensor before BatchNorm scales it, and the folded graph never holds it: an overflow there (trained statistics can bring 1e5 back to ~1) goes unseen, and one after the layer is named at the BatchNorm's module rather than the layer's"
)

func runFoldedBN(f *Facts) ([]checks.Finding, error) {
	g := f.Model.Proto.GetGraph()
	var byMeta, byName []string
	first := -1
	convs, norms := 0, 0
	for _, i := range f.Order {
		n := g.Node[i]
		switch n.OpType {
		case "Conv", "ConvTranspose":
			convs++
		case "BatchNormalization":
			norms++
		}
		if bn, layer, ok := onnx.FusedBatchNorm(n); ok {
			byMeta = append(byMeta, fmt.Sprintf("%s into %s", bn, layer))
		} else if onnx.FoldedByName(n, f.Model.Index) {
			byName = append(byName, fmt.Sprintf("%s (%s, %s)", onnx.NodeName(g, i), n.Input[1], n.Input[2]))
		} else {
			continue
		}
		if first < 0 {
			first = i
		}
	}
	switch {
	case len(byMeta) > 0:
		fd := checkFoldedBN.Finding(fmt.Sprintf("torch.onnx.export's optimizer folded %d BatchNorm(s) into the layer before them (%s): each Conv or Gemm node carries the BatchNorm's module and computes the layer with its statistics in the weight and bias; %s; %s",
			len(byMeta), strings.Join(limitNames(byMeta, 6), ", "), foldHides, dynamoUnfolded))
		fd.Node, fd.Module = onnx.NodeName(g, first), onnx.ModulePath(g.Node[first])
		return []checks.Finding{fd}, nil
	case len(byName) > 0:
		fd := checkFoldedBN.Finding(fmt.Sprintf("%d Conv node(s) read a weight and a bias the exporter computed (%s): the TorchScript exporter folds the BatchNorm after a Conv into it in eval mode; %s; %s",
			len(byName), strings.Join(limitNames(byName, 6), ", "), foldHides, torchScriptUnfolded))
		fd.Node, fd.Module = onnx.NodeName(g, first), onnx.ModulePath(g.Node[first])
		return []checks.Finding{fd}, nil
	case convs > 0 && norms == 0 && !onnx.FromDynamo(g):
		fd := checkFoldedBN.Finding(fmt.Sprintf("whether a BatchNorm was folded into the %d convolution(s) cannot be told from this export: it carries no module metadata (the dynamo exporter's) and its convolutions read weights under their own names, with no BatchNormalization node left; if the model has BatchNorm after its convolutions, %s, so that the audit sees the convolution's own output", convs, dynamoUnfolded))
		fd.Severity = checks.SevInfo
		return []checks.Finding{fd}, nil
	}
	return nil, nil
}

// limitNames keeps the first n entries and counts the rest.
func limitNames(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(append([]string(nil), s[:n]...), fmt.Sprintf("%d more", len(s)-n))
}
