package ops

// mlOps are ai.onnx.ml's: classical machine learning, none of which
// exists in PyTorch, so they all follow their inputs.
var mlOps = []Op{
	{Name: "ArrayFeatureExtractor", Domain: ML},
	{Name: "Binarizer", Domain: ML},
	{Name: "CastMap", Domain: ML},
	{Name: "CategoryMapper", Domain: ML},
	{Name: "DictVectorizer", Domain: ML},
	{Name: "FeatureVectorizer", Domain: ML},
	{Name: "Imputer", Domain: ML},
	{Name: "LabelEncoder", Domain: ML},
	{Name: "LinearClassifier", Domain: ML},
	{Name: "LinearRegressor", Domain: ML},
	{Name: "Normalizer", Domain: ML},
	{Name: "OneHotEncoder", Domain: ML},
	{Name: "SVMClassifier", Domain: ML},
	{Name: "SVMRegressor", Domain: ML},
	{Name: "Scaler", Domain: ML},
	{Name: "TreeEnsemble", Domain: ML},
	{Name: "TreeEnsembleClassifier", Domain: ML},
	{Name: "TreeEnsembleRegressor", Domain: ML},
	{Name: "ZipMap", Domain: ML, Holds: HoldsMaps},
}
