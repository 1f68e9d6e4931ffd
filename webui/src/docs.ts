// /docs: the gateway's OpenAPI document in Swagger UI, whose script and stylesheet the
// gateway serves itself (swagger-ui-dist, pinned in package.json, copied into dist/ by
// build.mjs): nothing is loaded from elsewhere onto the origin that holds the admin key.

/** The global that swagger-ui-bundle.js (loaded before this module) defines. */
declare const SwaggerUIBundle: {
  (options: Record<string, unknown>): unknown;
  presets: { apis: unknown };
};

SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  presets: [SwaggerUIBundle.presets.apis],
  deepLinking: true,
  queryConfigEnabled: false, // no ?url= or ?configUrl=: only this gateway's document
});
