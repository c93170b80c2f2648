package ops

// logicOps are the comparisons, the boolean logic on their results and
// Where, which selects by a condition (masked_fill exports as Where).
var logicOps = []Op{
	{Name: "And", Type: TypeBool, NonFloat: true, Shape: "broadcast", Grad: NoGrad},
	{Name: "Equal", Type: TypeBool, NonFloat: true, Shape: "broadcast", Grad: NoGrad, NonFinite: NonFiniteAsTorch},
	{Name: "Greater", Type: TypeBool, NonFloat: true, Shape: "broadcast", Grad: NoGrad, NonFinite: NonFiniteAsTorch},
	{Name: "GreaterOrEqual", Type: TypeBool, NonFloat: true, Shape: "broadcast", Grad: NoGrad},
	{Name: "IsInf", Type: TypeBool, NonFloat: true, Shape: "unary", Grad: NoGrad},
	{Name: "IsNaN", Type: TypeBool, NonFloat: true, Shape: "unary", Grad: NoGrad},
	{Name: "Less", Type: TypeBool, NonFloat: true, Shape: "broadcast", Grad: NoGrad},
	{Name: "LessOrEqual", Type: TypeBool, NonFloat: true, Shape: "broadcast", Grad: NoGrad},
	{Name: "Not", Type: TypeBool, NonFloat: true, Shape: "unary", Grad: NoGrad},
	{Name: "Or", Type: TypeBool, NonFloat: true, Shape: "broadcast", Grad: NoGrad},
	{Name: "Where", Autocast: Promote, Type: TypeSecond, Shape: "broadcast", Grad: "where", Role: CarriesInf | TypePromotes, Fill: "masked_fill", FillInputs: []int{1, 2}, NonFinite: NonFiniteAsTorch},
	{Name: "Xor", Type: TypeBool, NonFloat: true, Shape: "broadcast", Grad: NoGrad},
}
