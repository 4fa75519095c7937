"""The HTTP front: the route table, the OpenAI routes as named phases, the operations and admin routes,
request validation and OpenAI-shaped errors. Routes reach the rest of the daemon through `Services`."""
