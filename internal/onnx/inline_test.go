package onnx

import (
	"strings"
	"testing"
)

// TestInlineFunctions: calls expand into the function's nodes with the
// call's inputs and outputs and prefixed internal values; an attribute the
// body reads from its caller takes the call's value or the function's
// default; a function calling another expands all the way; an imported
// opset the model lacks is added; a function calling itself, and one
// importing another version of the model's opset, are refused by name.
func TestInlineFunctions(t *testing.T) {
	alpha := &AttributeProto{Name: "alpha", RefAttrName: "a", Type: AttributeProto_FLOAT}
	inner := &FunctionProto{Name: "Inner", Domain: "lib", Input: []string{"u"}, Output: []string{"v"},
		Node:        []*NodeProto{Node("LeakyRelu", "act", []string{"u"}, []string{"v"}, alpha)},
		Attribute:   []string{"a"},
		OpsetImport: []*OperatorSetIdProto{{Domain: "", Version: 17}}}
	outer := &FunctionProto{Name: "Outer", Domain: "lib", Input: []string{"x", "w"}, Output: []string{"y"},
		Node: []*NodeProto{
			Node("MatMul", "mm", []string{"x", "w"}, []string{"h"}),
			{OpType: "Inner", Domain: "lib", Name: "in", Input: []string{"h"}, Output: []string{"y"},
				Attribute: []*AttributeProto{AttrFloat("a", 0.5)}},
		},
		OpsetImport: []*OperatorSetIdProto{{Domain: "", Version: 17}, {Domain: "lib", Version: 1}, {Domain: "extra", Version: 3}}}
	g := &GraphProto{Name: "g",
		Node: []*NodeProto{
			{OpType: "Outer", Domain: "lib", Name: "/blocks/blocks.0/Outer", Input: []string{"x", "blocks.0.w"}, Output: []string{"a"}},
			{OpType: "Inner", Domain: "lib", Name: "plain", Input: []string{"a"}, Output: []string{"b"}},
		},
		Initializer: []*TensorProto{FloatTensor("blocks.0.w", []int64{2, 2}, make([]float32, 4))},
		Input:       []*ValueInfoProto{TensorValueInfo("x", TensorProto_FLOAT, 1, 2)},
		Output:      []*ValueInfoProto{TensorValueInfo("b", TensorProto_FLOAT, 1, 2)},
	}
	m := NewModel(g, 17)
	m.OpsetImport = append(m.OpsetImport, &OperatorSetIdProto{Domain: "lib", Version: 1})
	m.Functions = []*FunctionProto{inner, outer}
	names, err := InlineFunctions(m)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, ",") != "lib::Inner,lib::Outer" {
		t.Errorf("inlined %v", names)
	}
	var got []string
	for _, n := range m.Graph.Node {
		a := ""
		for _, at := range n.Attribute {
			a = at.Name
			if at.RefAttrName != "" || at.F == 0 {
				a += "?"
			}
		}
		got = append(got, n.OpType+":"+n.Name+"("+strings.Join(n.Input, ",")+")->"+strings.Join(n.Output, ",")+":"+a)
	}
	want := []string{
		"MatMul:/blocks/blocks.0/Outer.mm(x,blocks.0.w)->/blocks/blocks.0/Outer/h:",
		"LeakyRelu:/blocks/blocks.0/Outer.in.act(/blocks/blocks.0/Outer/h)->a:alpha",
		"LeakyRelu:plain/act(a)->b:",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("inlined graph:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if m.Graph.Node[1].Attribute[0].F != 0.5 {
		t.Errorf("alpha %v, want the call's 0.5", m.Graph.Node[1].Attribute[0].F)
	}
	if inner.Node[0].Attribute[0].RefAttrName != "a" || len(outer.Node[0].Input) != 2 || outer.Node[0].Input[0] != "x" {
		t.Error("the functions themselves changed")
	}
	extra := false
	for _, o := range m.OpsetImport {
		extra = extra || (o.Domain == "extra" && o.Version == 3)
	}
	if !extra {
		t.Errorf("opsets %v: want the functions' extra domain added", m.OpsetImport)
	}
	if _, err := NewIndex(m.Graph); err != nil {
		t.Errorf("the inlined graph does not index: %v", err)
	}

	self := &FunctionProto{Name: "Self", Domain: "lib", Input: []string{"x"}, Output: []string{"y"},
		Node: []*NodeProto{{OpType: "Self", Domain: "lib", Input: []string{"x"}, Output: []string{"y"}}}}
	m2 := NewModel(&GraphProto{Node: []*NodeProto{{OpType: "Self", Domain: "lib", Name: "s", Input: []string{"x"}, Output: []string{"y"}}}}, 17)
	m2.Functions = []*FunctionProto{self}
	if _, err := InlineFunctions(m2); err == nil || !strings.Contains(err.Error(), "lib::Self") {
		t.Errorf("a function calling itself: err %v", err)
	}
	clash := &FunctionProto{Name: "F", Domain: "lib", Input: []string{"x"}, Output: []string{"y"},
		Node:        []*NodeProto{Node("Relu", "r", []string{"x"}, []string{"y"})},
		OpsetImport: []*OperatorSetIdProto{{Domain: "", Version: 13}}}
	m3 := NewModel(&GraphProto{Node: []*NodeProto{{OpType: "F", Domain: "lib", Name: "f", Input: []string{"x"}, Output: []string{"y"}}}}, 17)
	m3.Functions = []*FunctionProto{clash}
	if _, err := InlineFunctions(m3); err == nil || !strings.Contains(err.Error(), "opset ai.onnx 13") {
		t.Errorf("a function of another opset version: err %v", err)
	}
}
