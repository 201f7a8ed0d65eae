package glm4moe_test

import (
	"testing"

	_ "github.com/ferrite-llm/ferrite/engine/models/glm4moe"
	"github.com/ferrite-llm/ferrite/engine/models/mla/mlatest"
)

// TestFixture checks the transformers fixture testdata/models/glm4_moe,
// including its NextN MTP layer.
func TestFixture(t *testing.T) { mlatest.Run(t, "glm4_moe") }
