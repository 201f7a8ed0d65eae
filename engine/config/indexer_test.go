package config

import (
	"slices"
	"testing"
)

func TestIndexerTypes(t *testing.T) {
	const f, s = FullIndexer, SharedIndexer
	for _, tc := range []struct {
		json string
		want []string
	}{
		{`{"indexer_types": ["full", "shared", "full"]}`, []string{f, s, f}},
		{`{"index_topk_pattern": "FSSX"}`, []string{f, s, s, "X"}},
		{`{}`, []string{f, f, f, f, f}}, // every layer from the offset 2 (and the ones before)
		{`{"index_topk_freq": 2}`, []string{f, f, s, f, s}},
		{`{"index_topk_freq": 3, "index_skip_topk_offset": 0}`, []string{s, s, f, s, s}},
	} {
		if got := mustParse(t, tc.json).IndexerTypes(5); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.json, got, tc.want)
		}
	}
}
