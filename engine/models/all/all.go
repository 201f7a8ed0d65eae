// Package all registers every architecture with engine/model; import it
// for its side effect.
package all

import (
	_ "github.com/ferrite-llm/ferrite/engine/models/deepseekv32"
	_ "github.com/ferrite-llm/ferrite/engine/models/glm4moe"
	_ "github.com/ferrite-llm/ferrite/engine/models/glm4moelite"
	_ "github.com/ferrite-llm/ferrite/engine/models/glm5next"
	_ "github.com/ferrite-llm/ferrite/engine/models/glmmoedsa"
	_ "github.com/ferrite-llm/ferrite/engine/models/llama"
	_ "github.com/ferrite-llm/ferrite/engine/models/mixtral"
	_ "github.com/ferrite-llm/ferrite/engine/models/qwen3"
	_ "github.com/ferrite-llm/ferrite/engine/models/qwen3moe"
	_ "github.com/ferrite-llm/ferrite/engine/models/qwen3next"
)
