package ops

// signalOps are the signal, image and text ops: Fourier transforms and
// their windows, image decoding, string processing.
var signalOps = []Op{
	{Name: "BlackmanWindow", FloatFactory: true},
	{Name: "DFT"},
	{Name: "HammingWindow", FloatFactory: true},
	{Name: "HannWindow", FloatFactory: true},
	{Name: "ImageDecoder"},
	{Name: "MelWeightMatrix", FloatFactory: true},
	{Name: "RegexFullMatch", NonFloat: true},
	{Name: "STFT"},
	{Name: "StringConcat", NonFloat: true},
	{Name: "StringNormalizer", NonFloat: true},
	{Name: "StringSplit", NonFloat: true},
	{Name: "TfIdfVectorizer"},
}
