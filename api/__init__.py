"""The REST API (`/v1`): a Quart-Trio app whose routes parse, authenticate, call one engine
function and render its result."""
