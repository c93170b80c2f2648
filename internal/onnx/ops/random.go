package ops

// randomOps draw random numbers: two copies of such a node differ, and
// nothing computed from one is a constant.
var randomOps = []Op{
	{Name: "Bernoulli", Grad: NoGrad, Random: true},
	{Name: "Multinomial", NonFloat: true, Grad: NoGrad, Random: true},
	{Name: "RandomNormal", FloatFactory: true, Grad: NoGrad, Random: true},
	{Name: "RandomNormalLike", Grad: NoGrad, Random: true},
	{Name: "RandomUniform", FloatFactory: true, Grad: NoGrad, Random: true},
	{Name: "RandomUniformLike", Grad: NoGrad, Random: true},
}
