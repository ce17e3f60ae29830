// The Fastify adapter under Fastify's real server (test/support/scenario.js has the contract).
import { startFastify } from './support/apps.js';
import { adapterSuite } from './support/scenario.js';

adapterSuite('fastify', startFastify);
