package glm4moelite_test

import (
	"testing"

	_ "github.com/ferrite-llm/ferrite/engine/models/glm4moelite"
	"github.com/ferrite-llm/ferrite/engine/models/mla/mlatest"
)

// TestFixture checks the transformers fixture testdata/models/glm4_moe_lite.
func TestFixture(t *testing.T) { mlatest.Run(t, "glm4_moe_lite") }
