package config

// The DSA indexer types of IndexerTypes.
const (
	FullIndexer   = "full"   // the layer runs its own indexer
	SharedIndexer = "shared" // the layer reuses the previous layer's selection
)

// IndexerTypes is GLM-5's per-layer indexer schedule for layers layers, as
// its configs spell it: "indexer_types" (a list), else
// "index_topk_pattern" (one letter a layer: F full, S shared; other
// letters are kept as they are, for the caller to reject), else every
// index_topk_freq-th layer from index_skip_topk_offset (defaults 1 and 2)
// is full and the rest shared.
func (c *Config) IndexerTypes(layers int) []string {
	var types []string
	switch {
	case c.Has("indexer_types"):
		types = c.Strings("indexer_types")
	case c.Has("index_topk_pattern"):
		for _, r := range c.StringOr("index_topk_pattern", "") {
			switch r {
			case 'F':
				types = append(types, FullIndexer)
			case 'S':
				types = append(types, SharedIndexer)
			default:
				types = append(types, string(r))
			}
		}
	default:
		freq := max(c.IntOr("index_topk_freq", 1), 1)
		off := c.IntOr("index_skip_topk_offset", 2)
		for i := range max(layers, 0) {
			t := SharedIndexer
			if max(i-off+1, 0)%freq == 0 {
				t = FullIndexer
			}
			types = append(types, t)
		}
	}
	return types
}
