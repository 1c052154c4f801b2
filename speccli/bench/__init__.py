"""`speccli bench`: settings and prompts in, measurement (`measure`), figures (`summary`, `theory`),
the greedy check (`greedy`), the typed report and its generated schema (`report`), the machine and
model files (`environment`), the JSON on disk (`files`), and its human-readable forms (`render`,
`compare`); `command` runs them in order."""
