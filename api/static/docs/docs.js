// Starts Swagger UI on /docs (a file, so that the page carries no inline script).
"use strict";

window.addEventListener("DOMContentLoaded", () => {
  // eslint-disable-next-line no-undef
  SwaggerUIBundle({
    url: document.body.dataset.openapi,
    dom_id: "#swagger-ui",
    // Deep links put a link inside each operation's toggle button (nested controls).
    deepLinking: false,
    layout: "BaseLayout",
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
});
