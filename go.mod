module github.com/ferrite-llm/ferrite

go 1.26
