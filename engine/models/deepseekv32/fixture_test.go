package deepseekv32_test

import (
	"testing"

	_ "github.com/ferrite-llm/ferrite/engine/models/deepseekv32"
	"github.com/ferrite-llm/ferrite/engine/models/mla/mlatest"
)

// TestFixture checks the transformers fixture testdata/models/deepseek_v32.
func TestFixture(t *testing.T) { mlatest.Run(t, "deepseek_v32") }
