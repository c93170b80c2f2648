package onnx

// Pieces is how a SplitToSequence node cuts its input: along Axis, into
// tensors of Sizes along it (their offsets are the running sums), each
// without that axis when Squeeze is set (no split input and keepdims 0:
// what torch.unbind exports as).
type Pieces struct {
	Axis    int
	Sizes   []int64
	Squeeze bool
}

// Offset returns where piece k starts along the axis.
func (p Pieces) Offset(k int) int64 {
	var off int64
	for _, s := range p.Sizes[:k] {
		off += s
	}
	return off
}

// Index returns the piece that position pos (SequenceAt's, negative
// counting from the end) reads, false when it reads none.
func (p Pieces) Index(pos int64) (int, bool) {
	n := int64(len(p.Sizes))
	if pos < 0 {
		pos += n
	}
	return int(pos), pos >= 0 && pos < n
}

// SplitPieces returns how SplitToSequence node n cuts a tensor of shape
// x, given the contents of its split input (hasSplit false when absent;
// scalar when the input is 0-dimensional: every piece that size but a
// shorter last one). ok is false where the attributes and shapes do not
// fit ONNX's definition.
func SplitPieces(n *NodeProto, x []int64, split []int64, hasSplit, scalar bool) (p Pieces, ok bool) {
	a := IntAttr(n, "axis", 0)
	if a < 0 {
		a += int64(len(x))
	}
	if a < 0 || a >= int64(len(x)) || x[a] < 0 {
		return Pieces{}, false
	}
	p.Axis = int(a)
	dim := x[a]
	switch {
	case !hasSplit:
		p.Squeeze = IntAttr(n, "keepdims", 1) == 0
		for range dim {
			p.Sizes = append(p.Sizes, 1)
		}
	case scalar:
		if len(split) != 1 || split[0] <= 0 {
			return Pieces{}, false
		}
		for off := int64(0); off < dim; off += split[0] {
			p.Sizes = append(p.Sizes, min(split[0], dim-off))
		}
	default:
		var sum int64
		for _, s := range split {
			if s < 0 {
				return Pieces{}, false
			}
			sum += s
		}
		if sum != dim {
			return Pieces{}, false
		}
		p.Sizes = append(p.Sizes, split...)
	}
	return p, true
}

// PieceShape returns the shape of piece k of a tensor of shape x.
func (p Pieces) PieceShape(x []int64, k int) []int64 {
	out := append([]int64(nil), x...)
	if p.Squeeze {
		return append(out[:p.Axis], out[p.Axis+1:]...)
	}
	out[p.Axis] = p.Sizes[k]
	return out
}
