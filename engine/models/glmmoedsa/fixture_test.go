package glmmoedsa_test

import (
	"testing"

	_ "github.com/ferrite-llm/ferrite/engine/models/glmmoedsa"
	"github.com/ferrite-llm/ferrite/engine/models/mla/mlatest"
)

// TestFixture checks the transformers fixture testdata/models/glm_moe_dsa.
func TestFixture(t *testing.T) { mlatest.Run(t, "glm_moe_dsa") }
