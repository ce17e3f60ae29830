// The Express adapter under Express's real server (test/support/scenario.js has the contract).
import { startExpress } from './support/apps.js';
import { adapterSuite } from './support/scenario.js';

adapterSuite('express', startExpress);
