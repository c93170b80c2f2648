package ops

// controlOps run subgraphs (If, Loop, Scan) or hold sequences and
// optional values.
var controlOps = []Op{
	{Name: "ConcatFromSequence"},
	{Name: "If", Subgraphs: true},
	{Name: "Loop", Subgraphs: true},
	{Name: "Optional"},
	{Name: "OptionalGetElement"},
	{Name: "OptionalHasElement", NonFloat: true},
	{Name: "Scan", Subgraphs: true},
	{Name: "SequenceAt"},
	{Name: "SequenceConstruct"},
	{Name: "SequenceEmpty"},
	{Name: "SequenceErase"},
	{Name: "SequenceInsert"},
	{Name: "SequenceLength", NonFloat: true},
	{Name: "SequenceMap", Subgraphs: true},
	{Name: "SplitToSequence"},
}
