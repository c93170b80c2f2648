package ops

// controlOps run subgraphs (If, Loop, Scan) or hold sequences and
// optional values. A sequence or an optional is no tensor (Holds): the
// tensors in it keep the precision they were put in with, and the stages
// round, observe and differentiate the tensors taken out of it, never the
// container. The dynamo exporter writes torch.chunk, torch.split and
// torch.unbind as SplitToSequence read by SequenceAt where its optimizer
// does not fold them into Split (optimize=False, the export that keeps
// BatchNorm apart from its convolution).
var controlOps = []Op{
	{Name: "ConcatFromSequence", Autocast: Promote, Type: TypeInput, Role: CarriesInf},
	{Name: "If", Subgraphs: true},
	{Name: "Loop", Subgraphs: true},
	{Name: "Optional", Type: TypeInput, Holds: HoldsOptionals},
	{Name: "OptionalGetElement", Type: TypeInput, Holds: HoldsElement, Role: CarriesInf},
	{Name: "OptionalHasElement", NonFloat: true, Type: TypeBool},
	{Name: "Scan", Subgraphs: true},
	{Name: "SequenceAt", Type: TypeInput, Shape: "sequenceAt", Grad: "sequenceAt", ParamInputs: []int{1}, Role: CarriesInf},
	{Name: "SequenceConstruct", Type: TypeInput, Holds: HoldsSequences, Role: CarriesInf},
	{Name: "SequenceEmpty", NonFloat: true, Holds: HoldsSequences},
	{Name: "SequenceErase", Type: TypeInput, Holds: HoldsSequences, Role: CarriesInf},
	{Name: "SequenceInsert", Type: TypeInput, Holds: HoldsSequences, Role: CarriesInf},
	{Name: "SequenceLength", NonFloat: true, Type: TypeInt64},
	{Name: "SequenceMap", Subgraphs: true, Holds: HoldsSequences},
	{Name: "SplitToSequence", Type: TypeInput, Grad: "splitToSequence", ParamInputs: []int{1}, Role: CarriesInf, Holds: HoldsSequences},
}
