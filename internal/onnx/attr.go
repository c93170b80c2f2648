package onnx

// Attribute getters and domain tests: the one definition every package
// uses to read a node.

// FindAttr returns n's attribute called name, or nil.
func FindAttr(n *NodeProto, name string) *AttributeProto {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a
		}
	}
	return nil
}

// IntAttr returns the integer attribute called name, or def when n has none.
func IntAttr(n *NodeProto, name string, def int64) int64 {
	if a := FindAttr(n, name); a != nil {
		return a.GetI()
	}
	return def
}

// FloatAttr returns the float attribute called name, or def when n has none.
func FloatAttr(n *NodeProto, name string, def float32) float32 {
	if a := FindAttr(n, name); a != nil {
		return a.GetF()
	}
	return def
}

// IntsAttr returns the integer list attribute called name and whether n has
// it.
func IntsAttr(n *NodeProto, name string) ([]int64, bool) {
	if a := FindAttr(n, name); a != nil {
		return a.GetInts(), true
	}
	return nil, false
}

// StringAttr returns the string attribute called name, or "".
func StringAttr(n *NodeProto, name string) string {
	if a := FindAttr(n, name); a != nil {
		return string(a.GetS())
	}
	return ""
}

// IsDefaultDomain reports whether domain names the default ONNX operator set
// (ai.onnx, also written as the empty string), where Conv, Cast and
// Constant live.
func IsDefaultDomain(domain string) bool { return domain == "" || domain == "ai.onnx" }

// IsStandardDomain reports whether domain is one of ONNX's own operator
// sets: the default one or ai.onnx.ml. Ops of other domains (onnxruntime's
// com.microsoft, custom ops) are outside the ONNX standard.
func IsStandardDomain(domain string) bool { return IsDefaultDomain(domain) || domain == "ai.onnx.ml" }
